//! PJRT events: completion of transfers and executions.

use std::panic::{AssertUnwindSafe, catch_unwind};

use libtpu_sys::{PJRT_Error, PJRT_Event};

use super::client::Client;
use super::ffi::{pjrt_call, pjrt_error};
use crate::error::Result;

/// A completion event. Dropping it destroys the PJRT event (exactly once); the client stays
/// alive as long as the event does.
pub struct Event {
    raw: *mut PJRT_Event,
    client: Client,
    what: &'static str,
}

// SAFETY: PJRT events may be awaited, queried and destroyed from any thread; the raw pointer is
// owned by this value alone.
unsafe impl Send for Event {}
// SAFETY: shared access only calls thread-safe query entries.
unsafe impl Sync for Event {}

impl std::fmt::Debug for Event {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Event({})", self.what)
    }
}

impl Event {
    /// Takes ownership of `raw`; `what` names the operation for error messages.
    ///
    /// # Safety
    ///
    /// `raw` must be a live event from `client`'s plugin that nobody else destroys.
    pub(crate) unsafe fn from_raw(
        raw: *mut PJRT_Event,
        client: Client,
        what: &'static str,
    ) -> Event {
        Event { raw, client, what }
    }

    /// True once the operation has finished (successfully or not).
    pub fn is_ready(&self) -> Result<bool> {
        let lib = self.client.lib();
        // SAFETY: `self.raw` is live while `self` exists.
        let args = unsafe { pjrt_call!(lib, PJRT_Event_IsReady { event: self.raw }) }?;
        Ok(args.is_ready)
    }

    /// Blocks until the operation finishes and returns its outcome.
    pub fn wait(&self) -> Result<()> {
        let lib = self.client.lib();
        let name = self.await_name();
        // SAFETY: `self.raw` is live while `self` exists. The returned error, if any, is the
        // operation's own failure.
        unsafe { pjrt_call!(lib, PJRT_Event_Await { event: self.raw }, name = name) }?;
        Ok(())
    }

    fn await_name(&self) -> &'static str {
        match self.what {
            "execute" => "PJRT_LoadedExecutable_Execute (completion)",
            "transfer to host" => "PJRT_Buffer_ToHostBuffer (completion)",
            "copy to device" => "PJRT_Buffer_CopyToDevice (completion)",
            "upload" => "PJRT_Client_BufferFromHostBuffer (completion)",
            _ => "PJRT_Event_Await",
        }
    }

    /// The outcome of a finished operation; call after [`Event::is_ready`] returned true.
    pub fn outcome(&self) -> Result<()> {
        let lib = self.client.lib();
        let name = self.await_name();
        // SAFETY: `self.raw` is live while `self` exists.
        unsafe { pjrt_call!(lib, PJRT_Event_Error { event: self.raw }, name = name) }?;
        Ok(())
    }

    /// Calls `f` with the outcome once the operation finishes, on a plugin thread (or at once
    /// if it already has). A panic in `f` is caught and never crosses into the plugin.
    pub fn on_ready(&self, f: impl FnOnce(Result<()>) + Send + 'static) -> Result<()> {
        type Callback = Box<dyn FnOnce(Result<()>) + Send>;
        struct Payload {
            f: Callback,
            client: Client,
            what: &'static str,
        }
        unsafe extern "C" fn trampoline(error: *mut PJRT_Error, user_arg: *mut std::ffi::c_void) {
            // SAFETY: `user_arg` is the `Box<Payload>` leaked below; the plugin calls this
            // callback exactly once, so the box is reclaimed exactly once.
            let payload = unsafe { Box::from_raw(user_arg.cast::<Payload>()) };
            let Payload { f, client, what } = *payload;
            // SAFETY: the callback owns `error` and must destroy it; `take_error` does, once.
            let outcome = match unsafe { client.lib().take_error(error) } {
                None => Ok(()),
                Some(e) => Err(pjrt_error(
                    if what == "execute" {
                        "PJRT_LoadedExecutable_Execute (completion)"
                    } else {
                        "PJRT_Event_OnReady"
                    },
                    e,
                )),
            };
            // Unwinding into C is undefined behaviour: stop any panic here.
            let _ = catch_unwind(AssertUnwindSafe(move || f(outcome)));
        }
        let payload = Box::into_raw(Box::new(Payload {
            f: Box::new(f),
            client: self.client.clone(),
            what: self.what,
        }));
        let lib = self.client.lib();
        // SAFETY: `self.raw` is live; the trampoline matches the callback signature and takes
        // ownership of `payload`.
        let r = unsafe {
            pjrt_call!(
                lib,
                PJRT_Event_OnReady {
                    event: self.raw,
                    callback: Some(trampoline),
                    user_arg: payload.cast(),
                }
            )
        };
        if r.is_err() {
            // The plugin refused the callback, so it will never run: reclaim the payload.
            // SAFETY: `payload` came from `Box::into_raw` above and was not handed over.
            drop(unsafe { Box::from_raw(payload) });
        }
        r.map(drop)
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        let lib = self.client.lib();
        // SAFETY: `self.raw` is live and owned by us; it is destroyed here exactly once. A
        // failure to destroy cannot be reported from `drop`.
        let _ = unsafe { pjrt_call!(lib, PJRT_Event_Destroy { event: self.raw }) };
    }
}
