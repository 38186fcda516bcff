//! A view made before any op ran still reaches autograd. This binary holds one test, so that
//! nothing connects the op library before it does.

use tpu_ops::autograd::AutogradOps;
use tpu_tensor::{Device, Result, Tensor};

/// x = torch.tensor([1.0], requires_grad=True)
/// x.expand(2, 2).flatten(1, 1).sum().backward(); x.grad  -> tensor([4.])
#[test]
fn views_made_first_thing_in_a_process_get_gradients() -> Result<()> {
    let x = Tensor::from_vec(vec![1f32], [1], &Device::cpu())?.requires_grad_(true)?;
    let s = x.expand([2, 2])?.flatten(1, 1)?;
    // `sum_all` is the first op this process dispatches.
    use tpu_ops::ops::reduce::ReduceOps;
    s.sum_all()?.backward()?;
    assert_eq!(
        x.grad().map(|g| g.to_vec::<f32>()).transpose()?,
        Some(vec![4.0])
    );
    Ok(())
}
