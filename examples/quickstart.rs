//! A first tour of tpu-rs: tensors on the default device, views that copy nothing, casts,
//! printing, random numbers and the device's memory statistics.
//!
//! Run with `cargo run --release --example quickstart` (add `-- pjrt` or `-- tpu` to pick
//! another device once one is available).

use tpu_rs::prelude::*;

fn main() {
    if let Err(e) = run() {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<()> {
    let spec = std::env::args().nth(1).unwrap_or_else(|| "cpu".to_string());
    let device = Device::parse(&spec)?;
    println!("device: {device}\n");

    let x = Tensor::arange(0, 12, 1, DType::F32, &device)?.reshape([3, 4])?;
    println!("x = arange(12).reshape(3, 4):\n{x}\n");

    // Views share storage with x: no element is copied.
    let xt = x.t()?;
    println!("x.t() (strides {:?}):\n{xt}\n", xt.strides());
    let every_other = x.slice(1, 0.., 2)?;
    println!("x[:, ::2]:\n{every_other}\n");
    println!("x[1] = {}", x.select(0, 1)?);
    println!("x.unsqueeze(0).shape = {:?}", x.unsqueeze(0)?.shape());
    println!(
        "x.narrow(1, 1, 2).expand([2, 3, 2]).shape = {:?}\n",
        x.narrow(1, 1, 2)?.expand([2, 3, 2])?.shape()
    );

    // A transposed view cannot be `view`ed as 1-D; `reshape` copies instead, as in PyTorch.
    match xt.view([-1]) {
        Ok(_) => println!("unexpected: view succeeded"),
        Err(e) => println!("xt.view([-1]) fails as in PyTorch:\n  {e}"),
    }
    println!("xt.reshape([-1]) = {}\n", xt.reshape([-1])?);

    // Casts use PyTorch's rounding: f32 -> bf16 rounds to nearest even.
    let y = Tensor::new([1.0f32 + 1.0 / 256.0, -2.7, 1e-3, 300.0], &device)?;
    println!("y = {y}");
    println!("y.to(bf16) = {}", y.to_dtype(DType::BF16)?);
    println!("y.to(i32)  = {}\n", y.to_dtype(DType::I32)?);

    let mut g = Generator::new(0);
    let r = Tensor::randn([2, 3], DType::F32, &device, &mut g)?;
    println!("randn(2, 3) with seed 0:\n{r}\n");
    println!("{r:?}\n");

    // Errors say what was expected and what was given.
    if let Err(e) = x.transpose(0, 2) {
        println!("x.transpose(0, 2): {e}");
    }
    if let Err(e) = x.to_vec::<i64>() {
        println!("x.to_vec::<i64>(): {e}\n");
    }

    let big = Tensor::zeros([1024, 1024], DType::F32, &device)?;
    println!(
        "after allocating a 4 MiB tensor: {}",
        device.memory_stats()?
    );
    drop(big);
    println!("after dropping it:              {}", device.memory_stats()?);
    Ok(())
}
