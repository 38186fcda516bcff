//! `PjrtLibrary::open` failures that need no plugin.

use std::path::PathBuf;

use libtpu_sys::{LoadError, PjrtLibrary};

fn temp_file(tag: &str, contents: &[u8]) -> PathBuf {
    let path = std::env::temp_dir().join(format!("libtpu-sys-{tag}-{}.so", std::process::id()));
    std::fs::write(&path, contents).unwrap();
    path
}

#[test]
fn nonexistent_path() {
    let path = std::env::temp_dir().join("libtpu-sys-no-such-dir/libnothing.so");
    let err = PjrtLibrary::open(&path).unwrap_err();
    assert!(
        matches!(&err, LoadError::NotFound { path: p } if *p == path),
        "{err}"
    );
    let text = err.to_string();
    assert!(text.contains("libnothing.so does not exist"), "{text}");
}

#[test]
fn library_without_get_pjrt_api() {
    // A bare name goes through the loader's search path; libc is always there.
    let err = PjrtLibrary::open("libc.so.6").unwrap_err();
    assert!(matches!(err, LoadError::MissingGetPjrtApi { .. }), "{err}");
    let text = err.to_string();
    assert!(
        text.contains("libc.so.6 has no `GetPjrtApi` symbol"),
        "{text}"
    );
}

#[test]
fn file_that_is_not_a_library() {
    let path = temp_file("not-a-library", b"this is plain text, not an ELF file\n");
    let err = PjrtLibrary::open(&path).unwrap_err();
    let _ = std::fs::remove_file(&path);
    let LoadError::Open { message, .. } = &err else {
        panic!("expected LoadError::Open, got {err}");
    };
    assert!(!message.is_empty());
    assert!(err.to_string().starts_with("cannot load "), "{err}");
}
