//! Lists every device tpu-rs can reach: the native CPU device, each PJRT plugin found and its
//! devices, and the result of TPU detection with its reason.
//!
//! `cargo run --release --example devices [-- key=value ...]`: the arguments are create options
//! for the PJRT clients (for XLA's CPU plugin, `cpu_device_count=4`); `TPU_RS_PJRT_OPTIONS` is
//! read when none are given.

use std::path::PathBuf;

use tpu_rs::libtpu_sys;
use tpu_rs::prelude::*;
use tpu_rs::tpu_runtime::pjrt::{self, Client};

fn main() {
    if let Err(e) = run() {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let options = if args.is_empty() {
        pjrt::parse_create_options(&std::env::var("TPU_RS_PJRT_OPTIONS").unwrap_or_default())?
    } else {
        pjrt::parse_create_options(&args.join(","))?
    };

    let cpu = Device::cpu();
    println!("{cpu}: {} ({})", cpu.description(), cpu.memory_stats()?);

    // PJRT plugins: the one TPU_RS_PJRT_PLUGIN names, and those in the project-local folder.
    let mut plugins: Vec<PathBuf> = Vec::new();
    if let Ok(p) = std::env::var(pjrt::plugin::ENV_PJRT_PLUGIN) {
        plugins.push(PathBuf::from(p));
    }
    for p in pjrt::plugin::local_plugins() {
        let canon = p.canonicalize().unwrap_or(p.clone());
        if !plugins
            .iter()
            .any(|q| q.canonicalize().unwrap_or(q.clone()) == canon)
        {
            plugins.push(p);
        }
    }
    if plugins.is_empty() {
        println!(
            "\nno PJRT plugin found: {}",
            pjrt::find_pjrt_plugin().unwrap_err()
        );
    }
    for path in plugins {
        println!("\nPJRT plugin {}", path.display());
        match Client::create(&path, &options) {
            Ok(client) => {
                let (major, minor) = client.api_version();
                println!(
                    "  platform {} {}, PJRT C API {major}.{minor}, {} addressable devices",
                    client.platform_name(),
                    client.platform_version(),
                    client.device_count()
                );
                for (i, dev) in client.devices().iter().enumerate() {
                    let info = client.device_info(i).expect("listed device");
                    println!(
                        "  {dev}: kind {:?}, id {}, local hardware id {}, {}",
                        info.kind,
                        info.id,
                        info.local_hardware_id,
                        dev.memory_stats()?
                    );
                }
            }
            Err(e) => println!("  unusable: {e}"),
        }
    }

    // TPUs: detection only; libtpu is asked for a client only when chips are present.
    println!();
    match libtpu_sys::detect() {
        Ok(inv) => {
            println!(
                "TPU: {} chip(s), generation {}",
                inv.chip_count(),
                inv.generation().map_or("unknown", |g| g.name())
            );
            match Client::tpu() {
                Ok(c) => {
                    for d in c.devices() {
                        println!("  {d}: {}", d.description());
                    }
                }
                Err(e) => println!("  libtpu client: {e}"),
            }
        }
        Err(none) => {
            println!("TPU: {none}");
            match pjrt::find_libtpu() {
                Ok(path) => match libtpu_sys::PjrtLibrary::open(&path) {
                    // Reading the version needs no client and no network.
                    Ok(lib) => {
                        let (major, minor) = lib.version();
                        println!(
                            "  libtpu at {} implements PJRT C API {major}.{minor}; no client created",
                            path.display()
                        );
                    }
                    Err(e) => println!("  libtpu at {} is unusable: {e}", path.display()),
                },
                Err(e) => println!("  {e}"),
            }
        }
    }
    Ok(())
}
