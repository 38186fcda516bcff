//! In-place methods and autograd across in-place writes, against PyTorch's values (each
//! snippet ran in torch 2.x; its printed result is the literal here), on every device.

use crate::common::{f32s, has, test_device, vals};
use tpu_ops::prelude::*;
use tpu_tensor::{DType, Device, Tensor};

fn leaf(v: &[f64], shape: &[usize], dev: &Device) -> Tensor {
    f32s(v, shape, dev).requires_grad_(true).unwrap()
}

fn grad(t: &Tensor) -> Vec<f64> {
    vals(&t.grad().expect("a gradient"))
}

test_device!(arithmetic_and_fills_match_pytorch, |dev| {
    // x = torch.tensor([1., 2., 3.]); v = x[1:]
    // x.add_(1).mul_(3).sub_(torch.tensor([1., 2., 3.])).div_(2)   -> tensor([2.5, 3.5, 4.5])
    // v                                                            -> tensor([3.5, 4.5])
    let x = f32s(&[1.0, 2.0, 3.0], &[3], &dev);
    let v = x.narrow(0, 1, 2).unwrap();
    let b = f32s(&[1.0, 2.0, 3.0], &[3], &dev);
    let r = x
        .add_(1.0)
        .unwrap()
        .mul_(3.0)
        .unwrap()
        .sub_(&b)
        .unwrap()
        .div_(2.0)
        .unwrap();
    assert!(r.is_same(&x));
    assert_eq!(vals(&x), [2.5, 3.5, 4.5]);
    assert_eq!(vals(&v), [3.5, 4.5]);

    // x = torch.tensor([1., 2.5, 4.]); x.clamp_(2, 3)          -> tensor([2.0, 2.5, 3.0])
    // x.masked_fill_(x > 2.4, 0)                               -> tensor([2., 0., 0.])
    let x = f32s(&[1.0, 2.5, 4.0], &[3], &dev);
    x.clamp_(Some(2.0), Some(3.0)).unwrap();
    assert_eq!(vals(&x), [2.0, 2.5, 3.0]);
    x.masked_fill_(&x.gt(2.4).unwrap(), 0.0).unwrap();
    assert_eq!(vals(&x), [2.0, 0.0, 0.0]);
    x.zero_().unwrap();
    assert_eq!(vals(&x), [0.0, 0.0, 0.0]);

    // z = torch.zeros(3); z.index_put_((torch.tensor([0, 0, 2]),), torch.tensor([1., 2., 3.]),
    //                                  accumulate=True)        -> tensor([3., 0., 3.])
    let z = f32s(&[0.0; 3], &[3], &dev);
    let idx = Tensor::new([0i64, 0, 2], &dev).unwrap();
    z.index_put_(&[Some(&idx)], &f32s(&[1.0, 2.0, 3.0], &[3], &dev), true)
        .unwrap();
    assert_eq!(vals(&z), [3.0, 0.0, 3.0]);

    // x = torch.tensor([1., 2., 3., 4.]); x[x > 2] = torch.tensor([10., 20.])
    // x                                                        -> tensor([1., 2., 10., 20.])
    let x = f32s(&[1.0, 2.0, 3.0, 4.0], &[4], &dev);
    let mask = x.gt(2.0).unwrap();
    x.index_put_(&[Some(&mask)], &f32s(&[10.0, 20.0], &[2], &dev), false)
        .unwrap();
    assert_eq!(vals(&x), [1.0, 2.0, 10.0, 20.0]);

    // Through a view: the base sees the write.
    // m = torch.zeros(2, 3); m[:, 1].add_(torch.tensor([5., 6.]))  -> m[:, 1] == [5., 6.]
    let m = f32s(&[0.0; 6], &[2, 3], &dev);
    m.select(1, 1)
        .unwrap()
        .add_(&f32s(&[5.0, 6.0], &[2], &dev))
        .unwrap();
    assert_eq!(vals(&m), [0.0, 5.0, 0.0, 0.0, 6.0, 0.0]);

    // An integer tensor keeps its dtype: torch.tensor([1, 2]).mul_(3) -> tensor([3, 6])
    let i = Tensor::new([1i64, 2], &dev).unwrap();
    i.mul_(3).unwrap();
    assert_eq!(i.dtype(), DType::I64);
    assert_eq!(vals(&i), [3.0, 6.0]);
});

test_device!(gradients_through_in_place_ops_match_pytorch, |dev| {
    // w = torch.tensor([1., 2., 3.], requires_grad=True)
    // y = w * 2; y.mul_(w); y.sum().backward(); w.grad        -> tensor([4., 8., 12.])
    let w = leaf(&[1.0, 2.0, 3.0], &[3], &dev);
    let y = w.mul(2.0).unwrap();
    y.mul_(&w).unwrap();
    assert!(y.requires_grad() && !y.is_leaf());
    y.sum(&[], false).unwrap().backward().unwrap();
    assert_eq!(grad(&w), [4.0, 8.0, 12.0]);

    // w.grad = None; y = w * 2
    // y.masked_fill_(torch.tensor([True, False, True]), 0); y.sum().backward()
    // w.grad                                                   -> tensor([0., 2., 0.])
    w.zero_grad();
    let y = w.mul(2.0).unwrap();
    let mask = Tensor::new([true, false, true], &dev).unwrap();
    y.masked_fill_(&mask, 0.0).unwrap();
    y.sum(&[], false).unwrap().backward().unwrap();
    assert_eq!(grad(&w), [0.0, 2.0, 0.0]);

    // w.grad = None; y = w * 3; y.zero_(); y.requires_grad     -> True
    // (y + w).sum().backward(); w.grad                         -> tensor([1., 1., 1.])
    w.zero_grad();
    let y = w.mul(3.0).unwrap();
    y.zero_().unwrap();
    assert!(y.requires_grad());
    y.add(&w)
        .unwrap()
        .sum(&[], false)
        .unwrap()
        .backward()
        .unwrap();
    assert_eq!(grad(&w), [1.0, 1.0, 1.0]);

    // w.grad = None; y = w * 1; y.sub_(w * w).div_(2); y.sum().backward()
    // w.grad                                                   -> tensor([-0.5, -1.5, -2.5])
    w.zero_grad();
    let y = w.mul(1.0).unwrap();
    y.sub_(&w.mul(&w).unwrap()).unwrap().div_(2.0).unwrap();
    y.sum(&[], false).unwrap().backward().unwrap();
    assert_eq!(grad(&w), [-0.5, -1.5, -2.5]);

    // w.grad = None; y = w * 1; y.clamp_(1.5, 2.5); y.sum().backward()
    // w.grad                                                   -> tensor([0., 1., 0.])
    w.zero_grad();
    let y = w.mul(1.0).unwrap();
    y.clamp_(Some(1.5), Some(2.5)).unwrap();
    y.sum(&[], false).unwrap().backward().unwrap();
    assert_eq!(grad(&w), [0.0, 1.0, 0.0]);

    // v = torch.tensor([1., 2., 3.], requires_grad=True); z = torch.zeros(3)
    // z.index_put_((torch.tensor([0, 0, 2]),), v, accumulate=True)   -> tensor([3., 0., 3.])
    // (z * torch.tensor([1., 2., 3.])).sum().backward(); v.grad      -> tensor([1., 1., 3.])
    let v = leaf(&[1.0, 2.0, 3.0], &[3], &dev);
    let z = f32s(&[0.0; 3], &[3], &dev);
    let idx = Tensor::new([0i64, 0, 2], &dev).unwrap();
    z.index_put_(&[Some(&idx)], &v, true).unwrap();
    assert!(z.requires_grad());
    assert_eq!(vals(&z), [3.0, 0.0, 3.0]);
    let c = f32s(&[1.0, 2.0, 3.0], &[3], &dev);
    z.mul(&c)
        .unwrap()
        .sum(&[], false)
        .unwrap()
        .backward()
        .unwrap();
    assert_eq!(grad(&v), [1.0, 1.0, 3.0]);

    // copy_ is differentiable too.
    // w.grad = None; y = w * 2; y.copy_(w * w); y.sum().backward(); w.grad -> tensor([2., 4., 6.])
    w.zero_grad();
    let y = w.mul(2.0).unwrap();
    y.copy_(&w.mul(&w).unwrap()).unwrap();
    y.sum(&[], false).unwrap().backward().unwrap();
    assert_eq!(grad(&w), [2.0, 4.0, 6.0]);

    // update_ writes any op's result: w.grad = None; y = w - 2; y.relu_(); y.sum().backward()
    // w.grad                                                   -> tensor([0., 0., 1.])
    w.zero_grad();
    let y = w.sub(2.0).unwrap();
    y.update_(|t| t.relu()).unwrap();
    y.sum(&[], false).unwrap().backward().unwrap();
    assert_eq!(grad(&w), [0.0, 0.0, 1.0]);
});

test_device!(gradients_through_writes_into_views_match_pytorch, |dev| {
    // w = torch.tensor([[1., 2.], [3., 4.]], requires_grad=True); c = torch.tensor([[1., 2.], [3., 4.]])
    // y = w * 1; y[0].mul_(10); (y * c).sum().backward(); w.grad -> tensor([[10., 20.], [3., 4.]])
    let w = leaf(&[1.0, 2.0, 3.0, 4.0], &[2, 2], &dev);
    let c = f32s(&[1.0, 2.0, 3.0, 4.0], &[2, 2], &dev);
    let y = w.mul(1.0).unwrap();
    y.select(0, 0).unwrap().mul_(10.0).unwrap();
    assert_eq!(vals(&y), [10.0, 20.0, 3.0, 4.0]);
    y.mul(&c)
        .unwrap()
        .sum(&[], false)
        .unwrap()
        .backward()
        .unwrap();
    assert_eq!(grad(&w), [10.0, 20.0, 3.0, 4.0]);

    // Views taken before the write pick up the new history.
    // w.grad = None; y = w * 1; u = y[0]; t = y.t(); y[0].mul_(10)
    // u.sum().backward(retain_graph=True); w.grad             -> tensor([[10., 10.], [0., 0.]])
    // w.grad = None; (t * c).sum().backward(); w.grad          -> tensor([[10., 30.], [2., 4.]])
    w.zero_grad();
    let y = w.mul(1.0).unwrap();
    let u = y.select(0, 0).unwrap();
    let t = y.t().unwrap();
    y.select(0, 0).unwrap().mul_(10.0).unwrap();
    u.sum(&[], false)
        .unwrap()
        .backward_with(None, true)
        .unwrap();
    assert_eq!(grad(&w), [10.0, 10.0, 0.0, 0.0]);
    w.zero_grad();
    t.mul(&c)
        .unwrap()
        .sum(&[], false)
        .unwrap()
        .backward()
        .unwrap();
    assert_eq!(grad(&w), [10.0, 30.0, 2.0, 4.0]);

    // A write into the base reaches views made before it.
    // a = torch.tensor([1., 2., 3., 4.], requires_grad=True); y = a * 1; v = y.view(2, 2)
    // y.mul_(a); v.sum().backward(); a.grad                    -> tensor([2., 4., 6., 8.])
    let a = leaf(&[1.0, 2.0, 3.0, 4.0], &[4], &dev);
    let y = a.mul(1.0).unwrap();
    let v = y.reshape([2, 2]).unwrap();
    y.mul_(&a).unwrap();
    v.sum(&[], false).unwrap().backward().unwrap();
    assert_eq!(grad(&a), [2.0, 4.0, 6.0, 8.0]);

    // A value that requires grad written into a buffer that does not.
    // a = torch.tensor([1., 2., 3.], requires_grad=True); buf = torch.zeros(2, 3)
    // buf[1] = a * 2; buf.requires_grad                        -> True
    // (buf * buf).sum().backward(); a.grad                     -> tensor([8., 16., 24.])
    let a = leaf(&[1.0, 2.0, 3.0], &[3], &dev);
    let buf = f32s(&[0.0; 6], &[2, 3], &dev);
    buf.select(0, 1)
        .unwrap()
        .copy_(&a.mul(2.0).unwrap())
        .unwrap();
    assert!(buf.requires_grad());
    buf.mul(&buf)
        .unwrap()
        .sum(&[], false)
        .unwrap()
        .backward()
        .unwrap();
    assert_eq!(grad(&a), [8.0, 16.0, 24.0]);

    // A view of a view, written through a transposed slice.
    // b = torch.tensor([[1., 2., 3.], [4., 5., 6.]], requires_grad=True); y = b * 1
    // y.t()[1:].add_(y.t()[:2] * 2)   # rows 1, 2 of y.t() += 2 * rows 0, 1 (read before)
    // y                                                        -> [[1., 4., 7.], [4., 13., 16.]]
    // y.sum().backward(); b.grad                               -> [[3., 3., 1.], [3., 3., 1.]]
    let b = leaf(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3], &dev);
    let y = b.mul(1.0).unwrap();
    let yt = y.t().unwrap();
    let src = yt.narrow(0, 0, 2).unwrap().mul(2.0).unwrap();
    yt.narrow(0, 1, 2).unwrap().add_(&src).unwrap();
    assert_eq!(vals(&y), [1.0, 4.0, 7.0, 4.0, 13.0, 16.0]);
    y.sum(&[], false).unwrap().backward().unwrap();
    assert_eq!(grad(&b), [3.0, 3.0, 1.0, 3.0, 3.0, 1.0]);
});

test_device!(in_place_errors_as_pytorch, |dev| {
    // a = torch.tensor([1., 2.], requires_grad=True); e = a.exp(); e.add_(1); e.sum().backward()
    // -> RuntimeError: one of the variables needed for gradient computation has been modified
    //    by an inplace operation
    let a = leaf(&[1.0, 2.0], &[2], &dev);
    let e = a.exp().unwrap();
    e.add_(1.0).unwrap();
    let msg = e
        .sum(&[], false)
        .unwrap()
        .backward()
        .unwrap_err()
        .to_string();
    has(msg, &["modified by an in-place operation", "clone"]);

    // An input a rule reads: p = a * b; b.mul_(2) with b a non-leaf -> the same error.
    let b = a.mul(3.0).unwrap();
    let p = a.mul(&b).unwrap();
    b.mul_(2.0).unwrap();
    let msg = p
        .sum(&[], false)
        .unwrap()
        .backward()
        .unwrap_err()
        .to_string();
    has(msg, &["modified by an in-place operation"]);

    // Outputs the rule does not read may be written: s = a.sum(); s.add_(1); s.backward()
    // a.grad                                                   -> tensor([1., 1.])
    let s = a.sum(&[], false).unwrap();
    s.add_(1.0).unwrap();
    s.backward().unwrap();
    assert_eq!(grad(&a), [1.0, 1.0]);

    // a.add_(1) -> RuntimeError: a leaf Variable that requires grad is being used in an
    // in-place operation. (Under no_grad it is allowed: that is how optimizers step.)
    let msg = a.add_(1.0).unwrap_err().to_string();
    has(msg, &["leaf tensor that requires grad", "no_grad"]);
    let msg = a
        .narrow(0, 0, 1)
        .unwrap()
        .mul_(2.0)
        .unwrap_err()
        .to_string();
    has(msg, &["view of a leaf tensor"]);
    let msg = a
        .copy_(&f32s(&[0.0, 0.0], &[2], &dev))
        .unwrap_err()
        .to_string();
    has(msg, &["leaf tensor"]);
    assert_eq!(vals(&a), [1.0, 2.0], "a refused write changes nothing");
    {
        let _g = no_grad();
        a.add_(1.0).unwrap();
    }
    assert_eq!(vals(&a), [2.0, 3.0]);
    assert!(a.is_leaf() && a.requires_grad());

    // torch.tensor([1, 2]).add_(1.5) -> RuntimeError: result type Float can't be cast to the
    // desired output type Long
    let i = Tensor::new([1i64, 2], &dev).unwrap();
    has(i.add_(1.5).unwrap_err().to_string(), &["f32", "i64"]);
    // torch.tensor([True]).add_(1) -> the same error (Long into Bool)
    let t = Tensor::new([true], &dev).unwrap();
    assert!(t.add_(1).is_err());
    // torch.zeros(3).add_(torch.zeros(2, 3)) -> RuntimeError: output with shape [3] doesn't
    // match the broadcast shape [2, 3]
    let x = f32s(&[0.0; 3], &[3], &dev);
    let msg = x
        .add_(&f32s(&[0.0; 6], &[2, 3], &dev))
        .unwrap_err()
        .to_string();
    has(msg, &["[2, 3]", "[3]"]);

    // An expanded tensor cannot take a write with a gradient:
    // y = (a * 1)[:1].expand(3); y.add_(1)
    // -> RuntimeError: unsupported operation: more than one element of the written-to tensor
    //    refers to a single memory location
    let y = a
        .mul(1.0)
        .unwrap()
        .narrow(0, 0, 1)
        .unwrap()
        .expand([3])
        .unwrap();
    has(
        y.add_(1.0).unwrap_err().to_string(),
        &["same memory location"],
    );
});

test_device!(outputs_only_some_rules_read_may_be_written, |dev| {
    // a = torch.tensor([1., 2.], requires_grad=True)
    // q = a / 2; q.add_(1); q.sum().backward(); a.grad          -> tensor([0.5, 0.5])
    let a = leaf(&[1.0, 2.0], &[2], &dev);
    let q = a.div(2.0).unwrap();
    q.add_(1.0).unwrap();
    q.sum(&[], false).unwrap().backward().unwrap();
    assert_eq!(grad(&a), [0.5, 0.5]);
    // a.grad = None; p = a ** 2; p.mul_(3); p.sum().backward(); a.grad -> tensor([6., 12.])
    a.zero_grad();
    let p = a.pow(&f32s(&[2.0], &[1], &dev)).unwrap();
    p.mul_(3.0).unwrap();
    p.sum(&[], false).unwrap().backward().unwrap();
    assert_eq!(grad(&a), [6.0, 12.0]);
    // a.grad = None; s = a.sum(0, keepdim=True); s.mul_(2); (s * a).sum().backward()
    // a.grad                                                   -> tensor([12., 12.])
    a.zero_grad();
    let s = a.sum(&[0], true).unwrap();
    s.mul_(2.0).unwrap();
    s.mul(&a)
        .unwrap()
        .sum(&[], false)
        .unwrap()
        .backward()
        .unwrap();
    assert_eq!(grad(&a), [12.0, 12.0]);
});

#[test]
fn values_that_require_grad_from_another_device_are_refused() {
    let Some(dev) = crate::common::pjrt("in-place write across devices") else {
        return;
    };
    let cpu = Device::cpu();
    let a = leaf(&[1.0, 2.0], &[2], &dev);
    let y = a.mul(2.0).unwrap();
    let buf = f32s(&[0.0; 2], &[2], &cpu);
    has(
        buf.copy_(&y).unwrap_err().to_string(),
        &["between devices", "no_grad"],
    );
    {
        // Without gradients the copy is a plain transfer.
        let _g = no_grad();
        buf.copy_(&y).unwrap();
    }
    assert_eq!(vals(&buf), [2.0, 4.0]);
}
