//! A guard on reading tensor values on the host. The graph layer forbids such reads while it
//! traces a function (a compiled program cannot branch on values it has not computed yet), or,
//! when the function may break into several graphs, watches them (the reads happen, and the
//! graph layer learns where); kernels, which read their inputs on the host by design, are
//! allowed again inside.
//!
//! Every read of a storage's bytes on the host goes through [`crate::Storage::with_host_bytes`],
//! which asks [`check`]; the public readers (`to_vec`, `to_scalar`, ...) pass their caller's
//! location down, so the error names the line of the user's code.

use std::cell::RefCell;
use std::panic::Location;
use std::rc::Rc;

use crate::Error;
use crate::scoped::with_pushed;

type Refusal = Rc<dyn Fn(&'static Location<'static>) -> Error>;
type Watcher = Rc<dyn Fn(&'static Location<'static>)>;

/// What a scope does with host reads.
#[derive(Clone)]
enum Scope {
    /// Refuses them with this error.
    Forbid(Refusal),
    /// Allows them and reports where they happen.
    Watch(Watcher),
    /// Allows them (inside a kernel).
    Allow,
}

thread_local! {
    /// The innermost scope decides.
    static SCOPES: RefCell<Vec<Scope>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` with host reads on this thread refused by the error `refuse` makes from the
/// location of the read.
pub fn forbid_host_reads<R>(
    refuse: impl Fn(&'static Location<'static>) -> Error + 'static,
    f: impl FnOnce() -> R,
) -> R {
    with_pushed(&SCOPES, Scope::Forbid(Rc::new(refuse)), f)
}

/// Runs `f` with host reads on this thread allowed and reported to `watch` with their location.
pub fn watch_host_reads<R>(
    watch: impl Fn(&'static Location<'static>) + 'static,
    f: impl FnOnce() -> R,
) -> R {
    with_pushed(&SCOPES, Scope::Watch(Rc::new(watch)), f)
}

/// Runs `f` with host reads allowed again (inside a kernel). Every kernel call passes here, so
/// when nothing forbids or watches reads it only looks at the stack.
pub fn allow_host_reads<R>(f: impl FnOnce() -> R) -> R {
    if guarded() {
        with_pushed(&SCOPES, Scope::Allow, f)
    } else {
        f()
    }
}

/// True when the innermost scope forbids or watches host reads.
fn guarded() -> bool {
    SCOPES.with(|s| matches!(s.borrow().last(), Some(Scope::Forbid(_) | Scope::Watch(_))))
}

/// True when the innermost scope refuses host reads (while the graph layer traces a function).
pub fn forbidden() -> bool {
    SCOPES.with(|s| matches!(s.borrow().last(), Some(Scope::Forbid(_))))
}

/// The error of a host read here, if the innermost scope refuses them.
#[track_caller]
pub fn check() -> Result<(), Error> {
    let scope = SCOPES.with(|s| s.borrow().last().cloned());
    match scope {
        Some(Scope::Forbid(refuse)) => Err(refuse(Location::caller())),
        Some(Scope::Watch(watch)) => {
            watch(Location::caller());
            Ok(())
        }
        Some(Scope::Allow) | None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scopes_nest_and_the_innermost_decides() {
        assert!(check().is_ok());
        let refuse = |loc: &'static Location<'static>| {
            Error::invalid_argument("read", format!("at line {}", loc.line()))
        };
        forbid_host_reads(refuse, || {
            let e = check().unwrap_err().to_string();
            assert!(e.contains(&format!("at line {}", line!() - 1)), "{e}");
            allow_host_reads(|| assert!(check().is_ok()));
            assert!(check().is_err());
        });
        assert!(check().is_ok());
    }

    #[test]
    fn watched_reads_happen_and_are_reported() {
        let seen = Rc::new(RefCell::new(Vec::new()));
        let s2 = seen.clone();
        watch_host_reads(
            move |loc| s2.borrow_mut().push(loc.line()),
            || {
                assert!(check().is_ok());
                allow_host_reads(|| assert!(check().is_ok()));
            },
        );
        assert_eq!(seen.borrow().len(), 1);
    }
}
