//! What the graph layer's capture sees of the work that does not pass through dispatch:
//! in-place writes (`copy_`, `fill_`, and everything built on them, such as optimizer steps),
//! which capture records as updates of the written tensors; and random draws, which it cannot
//! record (numbers drawn on the host while a function is traced would be the same on every
//! call), so they are refused while an observer is installed.

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use crate::Error;
use crate::scoped::with_pushed;
use crate::tensor::Tensor;

/// Told about every in-place write made on its thread while it is installed.
pub trait WriteObserver {
    /// `dst` now holds `src`'s values: `src` is already broadcast to `dst`'s shape and
    /// converted to its dtype and device.
    fn wrote(&self, dst: &Tensor, src: &Tensor);

    /// True when writes are only to be recorded, not made: the observer traces a function whose
    /// values are placeholders, and runs the recorded writes later as part of a program.
    fn records_only(&self) -> bool {
        false
    }
}

thread_local! {
    static OBSERVERS: RefCell<Vec<Rc<dyn WriteObserver>>> = const { RefCell::new(Vec::new()) };
    /// How many in-place writes of this thread are running now.
    static WRITING: Cell<usize> = const { Cell::new(0) };
}

/// Runs the body of an in-place write: the ops it dispatches to move bytes (a copy on a PJRT
/// device) are the write's own means, not part of the user's program.
pub(crate) fn writing<R>(f: impl FnOnce() -> R) -> R {
    struct Leave;
    impl Drop for Leave {
        fn drop(&mut self) {
            WRITING.with(|w| w.set(w.get() - 1));
        }
    }
    WRITING.with(|w| w.set(w.get() + 1));
    let _leave = Leave;
    f()
}

/// True inside the body of an in-place write: an observer that records ops ignores the ones
/// dispatched there, since the write itself is reported to it.
pub fn inside_write() -> bool {
    WRITING.with(|w| w.get() > 0)
}

/// Runs `f` with `observer` told about this thread's in-place writes (the innermost observer
/// is told).
pub fn observe_writes<R>(observer: Rc<dyn WriteObserver>, f: impl FnOnce() -> R) -> R {
    with_pushed(&OBSERVERS, observer, f)
}

/// True while an observer is installed on this thread: copies and casts then run as ops, so
/// that capture sees them.
pub fn observing() -> bool {
    OBSERVERS.with(|o| !o.borrow().is_empty())
}

/// True when the innermost observer records writes without their being made
/// ([`WriteObserver::records_only`]).
pub(crate) fn records_only() -> bool {
    let top = OBSERVERS.with(|o| o.borrow().last().cloned());
    top.is_some_and(|o| o.records_only())
}

/// Tells the innermost observer, if any, that `dst` now holds `src`.
pub(crate) fn notify(dst: &Tensor, src: &Tensor) {
    let top = OBSERVERS.with(|o| o.borrow().last().cloned());
    if let Some(o) = top {
        o.wrote(dst, src);
    }
}

/// The error of a random draw while a function is being captured.
pub(crate) fn refuse_random(op: &str) -> Result<(), Error> {
    if observing() {
        return Err(Error::invalid_argument(
            op,
            "random numbers drawn while a function is compiled would be drawn once, when it is \
             traced, and then be the same on every call: draw them outside the compiled \
             function and pass them in as an argument",
        ));
    }
    Ok(())
}
