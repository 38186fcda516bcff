//! The passes on random programs: every program gives the same bits with and without them, and
//! never has more nodes after them.

use proptest::prelude::*;
use tpu_graph::{CompileOptions, compile_with};
use tpu_ops::prelude::*;
use tpu_ops::tpu_tensor::{DType, Device, Generator, Result, Tensor};

/// One step of a random program: an op on earlier values (indices taken modulo their count).
#[derive(Clone, Debug)]
enum Step {
    Unary(u8, usize),
    Binary(u8, usize, usize),
}

fn run(steps: &[Step], outputs: &[usize], a: &[Tensor]) -> Result<Vec<Tensor>> {
    let mut vals: Vec<Tensor> = a.to_vec();
    for s in steps {
        let n = vals.len();
        let v = match *s {
            Step::Unary(k, i) => {
                let x = &vals[i % n];
                match k % 4 {
                    0 => x.tanh()?,
                    1 => x.neg()?,
                    2 => x.mul(0.5)?,
                    _ => x.sigmoid()?,
                }
            }
            Step::Binary(k, i, j) => {
                let (x, y) = (&vals[i % n], &vals[j % n]);
                match k % 3 {
                    0 => x.add(y)?,
                    1 => x.mul(y)?,
                    _ => x.sub(y)?,
                }
            }
        };
        vals.push(v);
    }
    let n = vals.len();
    Ok(outputs.iter().map(|o| vals[o % n].clone()).collect())
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        (0u8..4, 0usize..32).prop_map(|(k, i)| Step::Unary(k, i)),
        (0u8..3, 0usize..32, 0usize..32).prop_map(|(k, i, j)| Step::Binary(k, i, j)),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    #[test]
    fn passes_keep_every_output_bit(
        steps in prop::collection::vec(step(), 1..24),
        outputs in prop::collection::vec(0usize..64, 1..4),
        seed in 0u64..1000,
    ) {
        let dev = Device::cpu();
        let mut g = Generator::new(seed);
        let args = [
            g.randn([3, 5], DType::F32, &dev).unwrap(),
            g.randn([3, 5], DType::F32, &dev).unwrap(),
        ];
        let (s1, o1) = (steps.clone(), outputs.clone());
        let plain = compile_with(CompileOptions::default().optimize(false), move |a: &[Tensor]| run(&s1, &o1, a));
        let (s2, o2) = (steps.clone(), outputs.clone());
        let opt = compile_with(CompileOptions::default(), move |a: &[Tensor]| run(&s2, &o2, a));
        let want = plain.call(&args).unwrap();
        let got = opt.call(&args).unwrap();
        prop_assert_eq!(want.len(), got.len());
        for (w, g) in want.iter().zip(&got) {
            let wb: Vec<u32> = w.to_vec::<f32>().unwrap().iter().map(|x| x.to_bits()).collect();
            let gb: Vec<u32> = g.to_vec::<f32>().unwrap().iter().map(|x| x.to_bits()).collect();
            prop_assert_eq!(wb, gb);
        }
        let before = plain.graph(&args).unwrap().nodes().len();
        let after = opt.graph(&args).unwrap().nodes().len();
        prop_assert!(after <= before);
        // And against eager execution.
        let eager = run(&steps, &outputs, &args).unwrap();
        for (e, g) in eager.iter().zip(&got) {
            let eb: Vec<u32> = e.to_vec::<f32>().unwrap().iter().map(|x| x.to_bits()).collect();
            let gb: Vec<u32> = g.to_vec::<f32>().unwrap().iter().map(|x| x.to_bits()).collect();
            prop_assert_eq!(eb, gb);
        }
    }
}
