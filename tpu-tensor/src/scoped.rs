//! Thread-local stacks of scoped settings (the innermost scope decides): a value is pushed for
//! the length of a closure and popped when it returns or unwinds.

use std::cell::RefCell;
use std::thread::LocalKey;

/// Runs `f` with `value` pushed on the thread-local `stack`, popping it afterwards, also when
/// `f` panics.
pub fn with_pushed<T: 'static, R>(
    stack: &'static LocalKey<RefCell<Vec<T>>>,
    value: T,
    f: impl FnOnce() -> R,
) -> R {
    struct Pop<T: 'static>(&'static LocalKey<RefCell<Vec<T>>>);
    impl<T: 'static> Drop for Pop<T> {
        fn drop(&mut self) {
            self.0.with(|s| {
                s.borrow_mut().pop();
            });
        }
    }
    stack.with(|s| s.borrow_mut().push(value));
    let _pop = Pop(stack);
    f()
}
