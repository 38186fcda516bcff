//! Compiled functions against eager execution: the same bits on the native CPU device, the same
//! values (within f32 rounding) as one PJRT program, recompiles that explain themselves, and
//! in-place writes written back.

use tpu_graph::{CompileOptions, OnRecompileLimit, compile, compile_with, metrics, trace};
use tpu_ops::prelude::*;
use tpu_ops::tpu_tensor::{DType, Device, Generator, Result, Tensor};

fn randn(shape: &[usize], seed: u64, dev: &Device) -> Tensor {
    Generator::new(seed).randn(shape, DType::F32, dev).unwrap()
}

fn pjrt() -> Option<Device> {
    tpu_ops::testing::pjrt_device("tpu-graph compile")
}

fn bits(t: &Tensor) -> Vec<u32> {
    tpu_ops::testing::f32_bits(t).unwrap()
}

fn near(what: &str, got: &Tensor, want: &Tensor, tol: f32) {
    let (g, w) = (got.to_vec::<f32>().unwrap(), want.to_vec::<f32>().unwrap());
    assert_eq!(g.len(), w.len(), "{what}: lengths");
    for (i, (a, b)) in g.iter().zip(&w).enumerate() {
        assert!(
            (a - b).abs() <= tol * (1.0 + b.abs()),
            "{what}[{i}]: {a} vs {b}"
        );
    }
}

/// A two-layer MLP with cross-entropy, its loss and the gradients of both weights, computed
/// with autograd inside the function: forward and backward in one graph.
fn mlp_step(w1: Tensor, w2: Tensor) -> impl Fn(&[Tensor]) -> Result<Vec<Tensor>> + Send + Sync {
    move |a: &[Tensor]| {
        let (x, target) = (&a[0], &a[1]);
        w1.zero_grad();
        w2.zero_grad();
        let h = x.matmul(&w1.t()?)?.relu()?;
        let logits = h.matmul(&w2.t()?)?;
        let loss = tpu_ops::ops::nn::functional::cross_entropy(&logits, target)?;
        loss.backward()?;
        let (g1, g2) = (w1.grad().unwrap(), w2.grad().unwrap());
        Ok(vec![loss, g1, g2])
    }
}

fn mlp_case(dev: &Device) -> (Tensor, Tensor, Tensor, Tensor) {
    let w1 = randn(&[16, 8], 1, dev).requires_grad_(true).unwrap();
    let w2 = randn(&[4, 16], 2, dev).requires_grad_(true).unwrap();
    let x = randn(&[5, 8], 3, dev);
    let target = Tensor::new([0i64, 3, 1, 2, 3], dev).unwrap();
    (w1, w2, x, target)
}

#[test]
fn mlp_forward_and_backward_equal_eager_bit_for_bit_on_cpu() {
    let dev = Device::cpu();
    let (w1, w2, x, target) = mlp_case(&dev);
    let step = mlp_step(w1.clone(), w2.clone());
    let eager = step(&[x.clone(), target.clone()]).unwrap();
    let f = compile(mlp_step(w1, w2));
    for _ in 0..3 {
        let out = f.call(&[x.clone(), target.clone()]).unwrap();
        for (o, e) in out.iter().zip(&eager) {
            assert_eq!(bits(o), bits(e));
        }
    }
    assert_eq!(f.programs(), 1);
    let g = f.graph(&[x, target]).unwrap();
    let text = g.to_string();
    assert!(text.contains("matmul"), "{text}");
    assert!(g.nodes().len() > 6, "the backward is in the graph:\n{text}");
}

#[test]
fn mlp_step_runs_as_one_pjrt_program() {
    let Some(dev) = pjrt() else { return };
    let cpu = Device::cpu();
    let (w1, w2, x, target) = mlp_case(&cpu);
    let eager = mlp_step(w1.clone(), w2.clone())(&[x.clone(), target.clone()]).unwrap();
    let on = |t: &Tensor| t.to_device(&dev).unwrap();
    let (pw1, pw2) = (
        on(&w1.detach()).requires_grad_(true).unwrap(),
        on(&w2.detach()).requires_grad_(true).unwrap(),
    );
    let f = compile(mlp_step(pw1, pw2));
    let args = [on(&x), on(&target)];
    let out = f.call(&args).unwrap();
    let out2 = f.call(&args).unwrap();
    for ((o, o2), e) in out.iter().zip(&out2).zip(&eager) {
        near("pjrt vs eager cpu", &o.to_device(&cpu).unwrap(), e, 1e-5);
        assert_eq!(
            bits(&o.to_device(&cpu).unwrap()),
            bits(&o2.to_device(&cpu).unwrap())
        );
    }
    let text = f.stablehlo(&args).unwrap().expect("a module");
    assert_eq!(text.matches("func.func public @main").count(), 1, "{text}");
    assert!(text.matches("stablehlo.dot_general").count() >= 4, "{text}");
    assert_eq!(f.programs(), 1);
}

#[test]
fn views_inside_the_function_are_recorded() {
    let check = |dev: &Device| {
        let a = randn(&[6, 4], 7, dev);
        let body = |x: &[Tensor]| {
            let t = x[0].t()?; // a view, not dispatched
            let s = x[0].narrow(0, 2, 3)?; // a view with an offset
            Ok(vec![t.matmul(&x[0])?, s.exp()?, t.clone()])
        };
        let eager = body(std::slice::from_ref(&a)).unwrap();
        let out = compile(body).call(&[a]).unwrap();
        let cpu = Device::cpu();
        for (o, e) in out.iter().zip(&eager) {
            assert_eq!(o.shape(), e.shape());
            near(
                "view",
                &o.to_device(&cpu).unwrap(),
                &e.to_device(&cpu).unwrap(),
                1e-6,
            );
        }
    };
    check(&Device::cpu());
    if let Some(dev) = pjrt() {
        check(&dev);
    }
}

#[test]
fn a_new_shape_recompiles_and_says_why() {
    let dev = Device::cpu();
    let f = compile_with(
        CompileOptions::default().name("double"),
        |a: &[Tensor]| Ok(vec![a[0].mul(2.0)?]),
    );
    f.call(&[randn(&[4, 1920], 1, &dev)]).unwrap();
    f.call(&[randn(&[4, 1920], 2, &dev)]).unwrap();
    f.call(&[randn(&[4, 1280], 3, &dev)]).unwrap();
    assert_eq!(f.programs(), 2);
    let m = metrics();
    let row = m.functions.iter().find(|r| r.name == "double").unwrap();
    assert_eq!(
        (row.calls, row.compiles, row.hits, row.executions),
        // A trace computes nothing: a call that compiles runs the program too.
        (3, 2, 1, 3)
    );
    assert_eq!(
        row.recompile_reasons,
        vec!["arg 0 dim 1: 1920 → 1280".to_string()]
    );
    let table = m.to_string();
    assert!(
        table.contains("double") && table.contains("total"),
        "{table}"
    );
}

#[test]
fn the_recompile_limit_can_refuse() {
    let dev = Device::cpu();
    let opts = CompileOptions::default().recompile_limit(2, OnRecompileLimit::Error);
    let f = compile_with(opts, |a: &[Tensor]| Ok(vec![a[0].neg()?]));
    f.call(&[randn(&[1], 1, &dev)]).unwrap();
    f.call(&[randn(&[2], 1, &dev)]).unwrap();
    let e = f.call(&[randn(&[3], 1, &dev)]).unwrap_err().to_string();
    assert!(
        e.contains("compiled 3 times") && e.contains("arg 0 dim 0: 2 → 3"),
        "{e}"
    );
    // Signatures already compiled still run.
    f.call(&[randn(&[2], 5, &dev)]).unwrap();
}

#[test]
fn captured_tensors_are_read_on_every_call() {
    let dev = Device::cpu();
    let w = Tensor::new([1.0f32, 2.0], &dev).unwrap();
    let wc = w.clone();
    let f = compile(move |a: &[Tensor]| Ok(vec![a[0].mul(&wc)?]));
    let x = Tensor::new([3.0f32, 4.0], &dev).unwrap();
    assert_eq!(
        f.call(std::slice::from_ref(&x)).unwrap()[0]
            .to_vec::<f32>()
            .unwrap(),
        [3.0, 8.0]
    );
    w.copy_(&Tensor::new([10.0f32, 20.0], &dev).unwrap())
        .unwrap();
    assert_eq!(
        f.call(&[x]).unwrap()[0].to_vec::<f32>().unwrap(),
        [30.0, 80.0]
    );
}

#[test]
fn an_in_place_write_of_a_captured_tensor_is_written_back_each_call() {
    let dev = Device::cpu();
    let p = Tensor::new([1.0f32, 2.0], &dev).unwrap();
    let pc = p.clone();
    let f = compile(move |a: &[Tensor]| {
        let y = a[0].mul(&pc)?;
        pc.copy_(&y)?;
        Ok(vec![y])
    });
    let x = Tensor::new([3.0f32, 4.0], &dev).unwrap();
    for want in [[3.0f32, 8.0], [9.0, 32.0], [27.0, 128.0]] {
        assert_eq!(
            f.call(std::slice::from_ref(&x)).unwrap()[0]
                .to_vec::<f32>()
                .unwrap(),
            want
        );
        assert_eq!(p.to_vec::<f32>().unwrap(), want);
    }
    assert_eq!(f.programs(), 1);
}

#[test]
fn tracing_computes_and_writes_nothing() {
    let dev = Device::cpu();
    let p = Tensor::new([1.0f32, 2.0], &dev).unwrap();
    let pc = p.clone();
    let f = compile_with(
        CompileOptions::default().name("writes_nothing_when_traced"),
        move |a: &[Tensor]| {
            let y = a[0].mul(&pc)?;
            pc.copy_(&y)?;
            Ok(vec![y])
        },
    );
    let x = Tensor::new([3.0f32, 4.0], &dev).unwrap();
    // Asking for the graph traces and compiles the function; it does not run it.
    let g = f.graph(std::slice::from_ref(&x)).unwrap();
    assert!(g.to_string().contains("mul"), "{g}");
    assert_eq!(p.to_vec::<f32>().unwrap(), [1.0, 2.0]);
    let row = metrics();
    let row = row.functions.iter().find(|r| r.name == f.name()).unwrap();
    assert_eq!((row.compiles, row.executions), (1, 0));
    // The first call runs the compiled program once: one write, one execution.
    assert_eq!(
        f.call(std::slice::from_ref(&x)).unwrap()[0]
            .to_vec::<f32>()
            .unwrap(),
        [3.0, 8.0]
    );
    assert_eq!(p.to_vec::<f32>().unwrap(), [3.0, 8.0]);
}

#[test]
fn a_gradient_left_by_a_compiled_backward_says_where_its_value_is() {
    let dev = Device::cpu();
    let (w1, w2, x, target) = mlp_case(&dev);
    let f = compile(mlp_step(w1.clone(), w2));
    let out = f.call(&[x, target]).unwrap();
    // What the function returned holds values; what it left in `.grad` is the trace's.
    assert!(out[1].to_vec::<f32>().is_ok());
    let err = w1.grad().unwrap().to_vec::<f32>().unwrap_err().to_string();
    assert!(
        err.contains("only inside the compiled program") && err.contains("return the tensor"),
        "{err}"
    );
}

#[test]
fn the_same_program_gives_the_same_graph_text_and_fingerprint() {
    let dev = Device::cpu();
    let body = |a: &[Tensor]| Ok(vec![a[0].exp()?.add(&a[1])?.sum(&[0], false)?]);
    let args = [randn(&[3, 2], 1, &dev), randn(&[3, 2], 2, &dev)];
    let t1 = trace(&body, &args).unwrap();
    let t2 = trace(&body, &args).unwrap();
    assert_eq!(t1.graph.to_string(), t2.graph.to_string());
    assert_eq!(t1.graph.fingerprint(), t2.graph.fingerprint());
    let dot = t1.graph.to_dot();
    assert!(
        dot.starts_with("digraph") && dot.contains("exp") && dot.contains("-> out0"),
        "{dot}"
    );
    // Another program has another fingerprint.
    let t3 = trace(&|a: &[Tensor]| Ok(vec![a[0].exp()?.sub(&a[1])?]), &args).unwrap();
    assert_ne!(t1.graph.fingerprint(), t3.graph.fingerprint());
}

#[test]
fn passes_merge_repeats_and_drop_dead_code() {
    let dev = Device::cpu();
    let body = |a: &[Tensor]| {
        let _unused = a[0].log()?;
        let e1 = a[0].exp()?;
        let e2 = a[0].exp()?;
        Ok(vec![e1.add(&e2)?])
    };
    let x = randn(&[4], 1, &dev);
    let g = compile(body).graph(std::slice::from_ref(&x)).unwrap();
    // One exp and the add are left, and on the CPU they then run fused as one kernel.
    let names: Vec<&str> = g.nodes().iter().map(|n| n.op.name()).collect();
    assert_eq!(names, ["fused_elementwise"], "{g}");
    let program = g.nodes()[0].op.attrs();
    assert!(
        program.contains("t0 = exp(i0)") && program.contains("t1 = add(t0, t0)"),
        "{g}"
    );
    let raw = compile_with(CompileOptions::default().optimize(false), body);
    assert_eq!(
        raw.graph(std::slice::from_ref(&x)).unwrap().nodes().len(),
        4
    );
    assert_eq!(
        bits(&raw.call(std::slice::from_ref(&x)).unwrap()[0]),
        bits(&compile(body).call(&[x]).unwrap()[0])
    );
}

#[test]
fn a_host_read_while_tracing_names_the_line() {
    let dev = Device::cpu();
    let f = compile(|a: &[Tensor]| {
        let s = a[0].sum(&[], false)?;
        // Data-dependent control flow: cannot be compiled.
        if s.to_scalar::<f32>()? > 0.0 {
            Ok(vec![a[0].exp()?])
        } else {
            Ok(vec![a[0].neg()?])
        }
    });
    let msg = f.call(&[randn(&[3], 1, &dev)]).unwrap_err().to_string();
    assert!(
        msg.contains("read on the host at") && msg.contains("compile.rs:"),
        "{msg}"
    );
    // Kernels that read on the host themselves still run under capture (cross-entropy reads
    // its class weights inside its kernel).
    let w = Tensor::new([1.0f32, 2.0, 0.5], &dev).unwrap();
    let g = compile(move |a: &[Tensor]| {
        let opts = tpu_ops::ops::nn::CrossEntropyOptions::default().weight(&w);
        Ok(vec![tpu_ops::ops::nn::functional::cross_entropy_with(
            &a[0], &a[1], &opts,
        )?])
    });
    let x = randn(&[4, 3], 2, &dev);
    let t = Tensor::new([0i64, 2, 1, 0], &dev).unwrap();
    g.call(&[x, t]).unwrap();
}

#[test]
fn a_graph_exports_stablehlo_that_compiles_with_pjrt() {
    let dev = Device::cpu();
    let (w1, w2, x, target) = mlp_case(&dev);
    let f = compile(mlp_step(w1, w2));
    let text = f.graph(&[x, target]).unwrap().to_stablehlo().unwrap();
    assert!(text.contains("func.func public @main"), "{text}");
    assert!(text.contains("stablehlo.dot_general"), "{text}");
    if let Some(c) = tpu_ops::tpu_tensor::tpu_runtime::pjrt::testing::client_or_skip("to_stablehlo")
    {
        c.compile_for_device(&text, 0).unwrap();
    }
}

/// A spectral low-pass filter (rfft, a mask, irfft) and its gradient compile into one program
/// whose complex values stay inside it, with eager's values on every device.
#[test]
fn fourier_transforms_compile_into_one_program() {
    use tpu_ops::ops::fft::{FftNorm, irfft, rfft};
    let check = |dev: &Device| {
        let x = randn(&[4, 16], 21, dev);
        let w = randn(&[4, 16], 22, dev).requires_grad_(true).unwrap();
        let mask: Vec<f32> = (0..9).map(|k| if k < 4 { 1.0 } else { 0.0 }).collect();
        let mask = Tensor::from_vec(mask, [9usize, 1], &Device::cpu())
            .unwrap()
            .to_device(dev)
            .unwrap();
        let body = move |a: &[Tensor]| -> Result<Vec<Tensor>> {
            w.zero_grad();
            let spec = rfft(&a[0].mul(&w)?, None, -1, FftNorm::Backward)?.mul(&mask)?;
            let y = irfft(&spec, Some(16), -1, FftNorm::Backward)?;
            y.square()?.sum_all()?.backward()?;
            Ok(vec![y.detach(), w.grad().expect("a gradient")])
        };
        let body = std::sync::Arc::new(body);
        let eager = body(std::slice::from_ref(&x)).unwrap();
        let b = body.clone();
        let f = compile(move |a: &[Tensor]| b(a));
        let out = f.call(std::slice::from_ref(&x)).unwrap();
        let cpu = Device::cpu();
        for (o, e) in out.iter().zip(&eager) {
            near(
                "fft",
                &o.to_device(&cpu).unwrap(),
                &e.to_device(&cpu).unwrap(),
                1e-5,
            );
        }
        assert_eq!(f.programs(), 1);
        if !dev.is_cpu() {
            let text = f
                .stablehlo(std::slice::from_ref(&x))
                .unwrap()
                .expect("a module");
            assert!(
                text.contains("fft_type = #stablehlo<fft_type RFFT>"),
                "{text}"
            );
            assert!(text.contains("complex<f32>"), "{text}");
        }
    };
    check(&Device::cpu());
    if let Some(dev) = pjrt() {
        check(&dev);
    }
}

#[test]
fn in_place_methods_and_their_gradients_compile_into_one_program() {
    let check = |dev: &Device| {
        let x = randn(&[5, 4], 31, dev);
        let w = randn(&[3, 4], 32, dev).requires_grad_(true).unwrap();
        let body = move |a: &[Tensor]| -> Result<Vec<Tensor>> {
            w.zero_grad();
            let h = a[0].matmul(&w.t()?)?;
            h.mul_(2.0)?;
            // A write through a view, and one that reads the tensor it writes.
            h.narrow(1, 0, 1)?.zero_()?;
            h.clamp_(Some(-1.5), Some(1.5))?;
            h.add_(&a[0].narrow(1, 1, 3)?)?;
            let g = h.add(1.0)?;
            h.mul_(&g)?;
            h.sum_all()?.backward()?;
            Ok(vec![h.detach(), w.grad().expect("a gradient")])
        };
        let body = std::sync::Arc::new(body);
        let eager = body(std::slice::from_ref(&x)).unwrap();
        let b = body.clone();
        let f = compile(move |a: &[Tensor]| b(a));
        let cpu = Device::cpu();
        for _ in 0..2 {
            let out = f.call(std::slice::from_ref(&x)).unwrap();
            for (o, e) in out.iter().zip(&eager) {
                let (o, e) = (o.to_device(&cpu).unwrap(), e.to_device(&cpu).unwrap());
                if dev.is_cpu() {
                    assert_eq!(bits(&o), bits(&e));
                } else {
                    near("in place", &o, &e, 1e-5);
                }
            }
        }
        assert_eq!(f.programs(), 1);
    };
    check(&Device::cpu());
    if let Some(dev) = pjrt() {
        check(&dev);
    }
}
