//! A guard on reading tensor values on the host. The graph layer forbids such reads while it
//! traces a function (a compiled program cannot branch on values it has not computed yet), and
//! kernels, which read their inputs on the host by design, are allowed again inside.
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

thread_local! {
    /// The innermost scope decides: `Some` refuses reads with that error, `None` allows them.
    static SCOPES: RefCell<Vec<Option<Refusal>>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` with host reads on this thread refused by the error `refuse` makes from the
/// location of the read.
pub fn forbid_host_reads<R>(
    refuse: impl Fn(&'static Location<'static>) -> Error + 'static,
    f: impl FnOnce() -> R,
) -> R {
    with_pushed(&SCOPES, Some(Rc::new(refuse)), f)
}

/// Runs `f` with host reads allowed again (inside a kernel). Every kernel call passes here, so
/// when nothing forbids reads it only looks at the stack.
pub fn allow_host_reads<R>(f: impl FnOnce() -> R) -> R {
    let forbidden = SCOPES.with(|s| matches!(s.borrow().last(), Some(Some(_))));
    if forbidden {
        with_pushed(&SCOPES, None, f)
    } else {
        f()
    }
}

/// True when the innermost scope refuses host reads (while the graph layer traces a function).
pub fn forbidden() -> bool {
    SCOPES.with(|s| matches!(s.borrow().last(), Some(Some(_))))
}

/// The error of a host read here, if the innermost scope refuses them.
#[track_caller]
pub fn check() -> Result<(), Error> {
    let refusal = SCOPES.with(|s| s.borrow().last().cloned().flatten());
    match refusal {
        Some(refuse) => Err(refuse(Location::caller())),
        None => Ok(()),
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
}
