//! Tensors on PJRT devices (XLA's CPU plugin): moving there and back is bit-exact for every
//! dtype, views read correctly, and printing names the device.

use tpu_runtime::pjrt::testing::client_or_skip;
use tpu_tensor::{DType, Device, Generator, Tensor};

#[test]
fn to_device_and_back_is_bit_exact_for_every_dtype() {
    let Some(c) = client_or_skip("to_device_and_back_is_bit_exact_for_every_dtype") else {
        return;
    };
    let cpu = Device::cpu();
    let mut g = Generator::new(3);
    let base = Tensor::randn([3, 5], DType::F64, &cpu, &mut g)
        .unwrap()
        .mul_scalar_for_test(1000.0);
    for dtype in DType::ALL {
        let t = base.to_dtype(dtype).unwrap();
        for dev in c.devices() {
            let on = t.to_device(&dev).unwrap();
            assert_eq!(on.device(), &dev);
            assert_eq!(on.shape(), t.shape());
            let back = on.to_device(&cpu).unwrap();
            assert_eq!(
                back.to_host_bytes().unwrap(),
                t.to_host_bytes().unwrap(),
                "{dtype} via {dev}"
            );
        }
    }
}

#[test]
fn views_and_copies_of_device_tensors() {
    let Some(c) = client_or_skip("views_and_copies_of_device_tensors") else {
        return;
    };
    let dev = c.device(1).unwrap();
    let t = Tensor::arange(0, 12, 1, DType::I32, &dev)
        .unwrap()
        .reshape([3, 4])
        .unwrap();
    assert_eq!(t.device(), &dev);
    let tt = t.t().unwrap();
    assert_eq!(
        tt.to_vec::<i32>().unwrap(),
        [0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11]
    );
    let c2 = tt.contiguous().unwrap();
    assert_eq!(c2.device(), &dev);
    assert!(c2.is_contiguous());
    assert_eq!(c2.to_vec::<i32>().unwrap(), tt.to_vec::<i32>().unwrap());
    // Device to device within the client, then a cast that stays on the device.
    let moved = tt.to_device(&c.device(3).unwrap()).unwrap();
    assert_eq!(moved.to_vec::<i32>().unwrap(), tt.to_vec::<i32>().unwrap());
    let f = moved.to_dtype(DType::BF16).unwrap();
    assert_eq!(f.device().name(), "pjrt:3");
    assert_eq!(
        f.to_string(),
        "tensor([[ 0.,  4.,  8.],\n        [ 1.,  5.,  9.],\n        [ 2.,  6., 10.],\n        [ 3.,  7., 11.]], device='pjrt:3', dtype=bf16)"
    );
    let z = Tensor::zeros([2, 2], DType::F32, &dev).unwrap();
    assert_eq!(z.to_vec::<f32>().unwrap(), [0.0; 4]);
    let e = Tensor::eye(2, None, DType::F32, &dev).unwrap();
    assert_eq!(e.to_vec::<f32>().unwrap(), [1.0, 0.0, 0.0, 1.0]);
}

trait MulScalarForTest {
    fn mul_scalar_for_test(&self, k: f64) -> Tensor;
}

impl MulScalarForTest for Tensor {
    // The op library lives a layer up; scale through host data here.
    fn mul_scalar_for_test(&self, k: f64) -> Tensor {
        let v: Vec<f64> = self
            .to_vec::<f64>()
            .unwrap()
            .iter()
            .map(|x| x * k)
            .collect();
        Tensor::from_vec(v, self.shape(), self.device()).unwrap()
    }
}

#[test]
fn copy_in_place_on_a_device() {
    let Some(c) = client_or_skip("copy_in_place_on_a_device") else {
        return;
    };
    let dev = c.device(0).unwrap();
    let t = Tensor::zeros([2, 2], DType::F32, &dev).unwrap();
    let alias = t.clone();
    t.copy_(&Tensor::new([[1.0f64, 2.0], [3.0, 4.0]], &Device::cpu()).unwrap())
        .unwrap();
    assert_eq!(alias.to_vec::<f32>().unwrap(), [1.0, 2.0, 3.0, 4.0]);
    assert_eq!(alias.device(), &dev);
    // Writing into a view runs an op on the device; without the op library (this crate's
    // tests run without it) the storage makes a round trip through host memory.
    t.select(0, 0).unwrap().fill_(5.0).unwrap();
    assert_eq!(alias.to_vec::<f32>().unwrap(), [5.0, 5.0, 3.0, 4.0]);
}
