//! Trains an MLP (784-1024-1024-10) or a small CNN on Fashion-MNIST, shows progress, prints
//! the test accuracy and writes the loss curve as a PNG.
//!
//! ```sh
//! apt-get install dataset-fashion-mnist          # the data, if not installed yet
//! cargo run --release --example train_mnist -- --model mlp --epochs 5
//! cargo run --release --example train_mnist -- --model cnn --device pjrt
//! cargo run --release --example train_mnist -- --model mlp --compile   # one program per step
//! ```
//!
//! Options: `--device cpu|pjrt|tpu` (the model code is the same for all), `--model mlp|cnn`,
//! `--epochs N`, `--batch-size N`, `--lr X`, `--subset N` (first N training examples),
//! `--data DIR` (default: Debian's install folder), `--plot FILE.png`, `--seed N`, `--compile`
//! (each training step, forward to optimizer update, runs as one compiled program).

#[path = "mnist/train.rs"]
mod mnist;

use std::path::PathBuf;

use indicatif::{ProgressBar, ProgressStyle};
use mnist::{ModelKind, TrainConfig, train};
use plotters::prelude::*;
use tpu_rs::datasets::{FASHION_MNIST_DIR, FashionMnist};
use tpu_rs::prelude::*;

struct Args {
    device: String,
    config: TrainConfig,
    data: PathBuf,
    plot: PathBuf,
}

fn parse_args() -> std::result::Result<Args, String> {
    let mut a = Args {
        device: "cpu".into(),
        config: TrainConfig::default(),
        data: PathBuf::from(FASHION_MNIST_DIR),
        plot: PathBuf::from("loss_curve.png"),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        let num = |v: String| {
            v.parse::<f64>()
                .map_err(|_| format!("{flag}: expected a number, got {v:?}"))
        };
        match flag.as_str() {
            "--device" => a.device = value()?,
            "--compile" => a.config.compile = true,
            "--model" => {
                a.config.model = match value()?.as_str() {
                    "mlp" => ModelKind::Mlp,
                    "cnn" => ModelKind::Cnn,
                    other => return Err(format!("--model: expected mlp or cnn, got {other:?}")),
                }
            }
            "--epochs" => a.config.epochs = num(value()?)? as usize,
            "--batch-size" => a.config.batch_size = num(value()?)? as usize,
            "--lr" => a.config.lr = num(value()?)?,
            "--subset" => a.config.subset = Some(num(value()?)? as usize),
            "--seed" => a.config.seed = num(value()?)? as u64,
            "--data" => a.data = PathBuf::from(value()?),
            "--plot" => a.plot = PathBuf::from(value()?),
            other => {
                return Err(format!(
                    "unknown option {other:?}; see the example's header for the options"
                ));
            }
        }
    }
    Ok(a)
}

fn plot(
    losses: &[f32],
    path: &PathBuf,
    title: &str,
) -> std::result::Result<(), Box<dyn std::error::Error>> {
    let root = BitMapBackend::new(path, (900, 500)).into_drawing_area();
    root.fill(&WHITE)?;
    let max = losses.iter().copied().fold(0.0f32, f32::max).max(1e-3);
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(56)
        .build_cartesian_2d(0..losses.len(), 0f32..max * 1.05)?;
    chart
        .configure_mesh()
        .x_desc("step")
        .y_desc("training loss")
        .draw()?;
    chart.draw_series(LineSeries::new(
        losses.iter().enumerate().map(|(i, l)| (i, *l)),
        &BLUE,
    ))?;
    // A moving average makes the trend readable through batch noise.
    let w = 50.min(losses.len().max(1));
    let smooth: Vec<(usize, f32)> = (w - 1..losses.len())
        .map(|i| (i, losses[i + 1 - w..=i].iter().sum::<f32>() / w as f32))
        .collect();
    chart.draw_series(LineSeries::new(smooth, RED.stroke_width(2)))?;
    root.present()?;
    Ok(())
}

fn main() {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(2);
        }
    };
    if let Err(e) = run(args) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

fn run(args: Args) -> Result<()> {
    let device = Device::parse(&args.device)?;
    let data = FashionMnist::load(&args.data)?;
    let cfg = &args.config;
    println!(
        "Fashion-MNIST: {} training and {} test images; model {:?}; device {device}{}; {} epochs, batch {}, Adam lr {}",
        cfg.subset.unwrap_or(data.train.len()).min(data.train.len()),
        data.test.len(),
        cfg.model,
        if cfg.compile { ", compiled steps" } else { "" },
        cfg.epochs,
        cfg.batch_size,
        cfg.lr
    );
    let bar = ProgressBar::new(0);
    bar.set_style(
        ProgressStyle::with_template("epoch {prefix} [{bar:30}] {pos}/{len} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    let start = std::time::Instant::now();
    let mut seen = 0usize;
    let (_, report) = train(
        cfg,
        &data.train,
        &data.test,
        &device,
        |epoch, step, steps, loss| {
            if step == 0 {
                bar.set_length(steps as u64);
                bar.set_position(0);
                bar.set_prefix(format!("{}/{}", epoch + 1, cfg.epochs));
            }
            seen += cfg.batch_size;
            let rate = seen as f64 / start.elapsed().as_secs_f64();
            bar.set_message(format!("loss {loss:.4}  {rate:.0} images/s"));
            bar.inc(1);
        },
    )?;
    bar.finish_and_clear();
    for (e, (acc, tput)) in report
        .test_accuracy
        .iter()
        .zip(&report.throughput)
        .enumerate()
    {
        println!(
            "epoch {}: test accuracy {:.2} %, {:.0} training images/s",
            e + 1,
            acc * 100.0,
            tput
        );
    }
    let acc = report.test_accuracy.last().copied().unwrap_or(0.0);
    println!(
        "final test accuracy: {:.2} % ({:.1} s in all)",
        acc * 100.0,
        start.elapsed().as_secs_f64()
    );
    let title = format!(
        "Fashion-MNIST {:?} on {device}: test accuracy {:.2} %",
        cfg.model,
        acc * 100.0
    );
    match plot(&report.losses, &args.plot, &title) {
        Ok(()) => println!("loss curve written to {}", args.plot.display()),
        Err(e) => eprintln!(
            "could not write the loss curve to {}: {e}",
            args.plot.display()
        ),
    }
    Ok(())
}
