//! Process-wide on/off settings that start from an environment variable.

use std::sync::Once;
use std::sync::atomic::{AtomicBool, Ordering};

/// A process-wide switch: `default` until the environment variable `var` holds the other
/// setting (`1` to turn on a default-off switch, `0` to turn off a default-on one), read on first
/// use; [`EnvSwitch::set`] overrides both.
pub struct EnvSwitch {
    var: &'static str,
    default: bool,
    on: AtomicBool,
    init: Once,
}

impl EnvSwitch {
    /// A switch read from `var`, `default` when `var` does not say otherwise.
    pub const fn new(var: &'static str, default: bool) -> Self {
        EnvSwitch {
            var,
            default,
            on: AtomicBool::new(default),
            init: Once::new(),
        }
    }

    /// The current setting.
    pub fn get(&self) -> bool {
        self.init.call_once(|| {
            let flip = if self.default { "0" } else { "1" };
            if std::env::var(self.var).is_ok_and(|v| v.trim() == flip) {
                self.on.store(!self.default, Ordering::Relaxed);
            }
        });
        self.on.load(Ordering::Relaxed)
    }

    /// Sets the switch for the whole process; the environment variable is no longer read.
    pub fn set(&self, on: bool) {
        self.init.call_once(|| {});
        self.on.store(on, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::EnvSwitch;

    #[test]
    fn default_until_set() {
        static ON: EnvSwitch = EnvSwitch::new("TPU_RS_TEST_SWITCH_NEVER_SET", true);
        static OFF: EnvSwitch = EnvSwitch::new("TPU_RS_TEST_SWITCH_NEVER_SET", false);
        assert!(ON.get());
        assert!(!OFF.get());
        ON.set(false);
        OFF.set(true);
        assert!(!ON.get());
        assert!(OFF.get());
    }
}
