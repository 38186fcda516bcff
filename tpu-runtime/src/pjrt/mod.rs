//! PJRT devices: plugins (libtpu, XLA's CPU plugin, any other PJRT plugin), clients, buffers,
//! executables and events.
//!
//! Every call into a plugin goes through `ffi::call` (by way of `ffi::pjrt_call!`, which names
//! the entry once and fills a fresh argument struct), which turns a returned `PJRT_Error` into
//! [`crate::Error::Pjrt`] naming the C API function and destroys it exactly once. Handles keep
//! their client alive (`Arc`), so any drop order is safe.

mod buffer;
mod client;
mod event;
mod executable;
mod ffi;
pub mod plugin;
pub mod signature;

pub use buffer::{PjrtBuffer, from_pjrt_type, to_pjrt_type};
pub use client::{Client, PjrtDeviceInfo};
pub use event::Event;
pub use executable::{ENV_LAUNCH_BLOCKING, Executable, launch_blocking, set_launch_blocking};
pub use libtpu_sys::compile_options::{self, CompileOptions};
pub use plugin::{OptionValue, find_libtpu, find_pjrt_plugin, load_plugin, parse_create_options};

pub mod testing {
    //! Finding the PJRT plugin in tests: one shared client with 4 devices, or a clear skip.

    use std::sync::OnceLock;

    use super::{Client, OptionValue, find_pjrt_plugin};

    /// Environment variable: when `1` (CI sets it), a missing plugin fails PJRT tests instead
    /// of skipping them.
    pub const ENV_REQUIRE_PJRT: &str = "TPU_RS_REQUIRE_PJRT";

    /// A process-wide client of the PJRT plugin with `cpu_device_count=4`, or `None` after
    /// printing one line that says the test `test` was skipped and why. Panics instead of
    /// skipping when `TPU_RS_REQUIRE_PJRT=1`.
    pub fn client_or_skip(test: &str) -> Option<Client> {
        static CLIENT: OnceLock<Result<Client, String>> = OnceLock::new();
        let c = CLIENT.get_or_init(|| {
            let path = find_pjrt_plugin().map_err(|e| e.to_string())?;
            Client::create(&path, &[("cpu_device_count".into(), OptionValue::Int(4))])
                .map_err(|e| e.to_string())
        });
        match c {
            Ok(c) => Some(c.clone()),
            Err(reason) => {
                if std::env::var(ENV_REQUIRE_PJRT).is_ok_and(|v| v == "1") {
                    panic!(
                        "{test}: {ENV_REQUIRE_PJRT}=1 but the PJRT plugin is unusable: {reason}"
                    );
                }
                eprintln!("skipped: {test}: {reason}");
                None
            }
        }
    }
}
