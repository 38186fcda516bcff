//! Seeded random numbers that are the same on every machine.
//!
//! The generator is Philox 4x32-10, a counter-based generator (the family JAX and XLA use): the
//! n-th number depends only on the seed and n, so results do not depend on thread count or
//! platform. Transcendentals for normal samples come from the `libm` crate, not the system
//! library, for the same reason.

use tpu_runtime::{DType, Device, Element, Error, Result, with_element};

use crate::shape::{IntoShape, checked_numel, exact_shape};
use crate::tensor::Tensor;

const PHILOX_M0: u32 = 0xD251_1F53;
const PHILOX_M1: u32 = 0xCD9E_8D57;
const PHILOX_W0: u32 = 0x9E37_79B9;
const PHILOX_W1: u32 = 0xBB67_AE85;

fn philox4x32(counter: [u32; 4], key: [u32; 2]) -> [u32; 4] {
    let mut c = counter;
    let mut k = key;
    for round in 0..10 {
        if round > 0 {
            k[0] = k[0].wrapping_add(PHILOX_W0);
            k[1] = k[1].wrapping_add(PHILOX_W1);
        }
        let p0 = (PHILOX_M0 as u64) * (c[0] as u64);
        let p1 = (PHILOX_M1 as u64) * (c[2] as u64);
        c = [
            ((p1 >> 32) as u32) ^ c[1] ^ k[0],
            p1 as u32,
            ((p0 >> 32) as u32) ^ c[3] ^ k[1],
            p0 as u32,
        ];
    }
    c
}

/// A seeded source of random tensors. Same seed, same numbers, everywhere.
#[derive(Clone, Debug)]
pub struct Generator {
    seed: u64,
    /// Blocks of four 32-bit outputs consumed so far.
    offset: u64,
}

impl Generator {
    /// A generator started from `seed`.
    pub fn new(seed: u64) -> Generator {
        Generator { seed, offset: 0 }
    }

    /// The seed this generator started from.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// Restarts the generator from `seed`.
    pub fn manual_seed(&mut self, seed: u64) {
        self.seed = seed;
        self.offset = 0;
    }

    /// Blocks consumed so far (with the seed, the whole state).
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// The next 32-bit word (for seeding other state, such as dropout masks).
    pub fn next_u32(&mut self) -> u32 {
        let w = self.stream().next();
        self.advance(1);
        w
    }

    /// The next 64-bit word.
    pub fn next_u64(&mut self) -> u64 {
        let mut s = self.stream();
        let (lo, hi) = (s.next() as u64, s.next() as u64);
        self.advance(2);
        lo | (hi << 32)
    }

    /// The words from the current state on. Callers advance the state only once their tensor
    /// exists, so a size that fails (too large for memory) leaves the generator as it was.
    fn stream(&self) -> Words {
        Words::new(self.seed, self.offset)
    }

    /// Advances past `words` words, in whole blocks of four.
    fn advance(&mut self, words: u128) {
        self.offset = self.offset.wrapping_add(words.div_ceil(4) as u64);
    }

    /// Uniform samples in `[0, 1)` of a float dtype. Each value uses as many random bits as the
    /// dtype's mantissa holds, so rounding can never produce 1.
    pub fn rand(&mut self, shape: impl IntoShape, dtype: DType, device: &Device) -> Result<Tensor> {
        crate::observe::refuse_random("rand")?;
        let shape = exact_shape("rand", shape)?;
        float_only("rand", dtype)?;
        let n = checked_numel("rand", &shape)?;
        let bits = mantissa_bits(dtype);
        let mut words = self.stream();
        let t = with_element!(dtype, T, {
            Tensor::from_fn_overwrite::<T>(&shape, device, |out| {
                for o in out.iter_mut() {
                    *o = T::from_f64(words.uniform(bits));
                }
                Ok(())
            })
        })?;
        self.advance(n as u128 * words_per_uniform(bits));
        Ok(t)
    }

    /// Standard normal samples (Box-Muller on uniform pairs, computed in f64).
    pub fn randn(
        &mut self,
        shape: impl IntoShape,
        dtype: DType,
        device: &Device,
    ) -> Result<Tensor> {
        crate::observe::refuse_random("randn")?;
        let shape = exact_shape("randn", shape)?;
        float_only("randn", dtype)?;
        let n = checked_numel("randn", &shape)?;
        let mut words = self.stream();
        let t = with_element!(dtype, T, {
            Tensor::from_fn_overwrite::<T>(&shape, device, |out| {
                for pair in out.chunks_mut(2) {
                    let (u0, u1) = (words.uniform(53), words.uniform(53));
                    // 1 - u lies in (0, 1], so the logarithm is finite.
                    let r = libm::sqrt(-2.0 * libm::log(1.0 - u0));
                    let theta = 2.0 * std::f64::consts::PI * u1;
                    pair[0] = T::from_f64(r * libm::cos(theta));
                    if let Some(o) = pair.get_mut(1) {
                        *o = T::from_f64(r * libm::sin(theta));
                    }
                }
                Ok(())
            })
        })?;
        // An odd count still uses a whole pair of uniforms.
        self.advance((n as u128).div_ceil(2) * 2 * words_per_uniform(53));
        Ok(t)
    }

    /// Uniform integers in `[low, high)`.
    pub fn randint(
        &mut self,
        low: i64,
        high: i64,
        shape: impl IntoShape,
        dtype: DType,
        device: &Device,
    ) -> Result<Tensor> {
        crate::observe::refuse_random("randint")?;
        let shape = exact_shape("randint", shape)?;
        if low >= high {
            return Err(Error::invalid_argument(
                "randint",
                format!("expected low < high, got low {low} and high {high}"),
            ));
        }
        let span = (high as i128 - low as i128) as u128;
        let n = checked_numel("randint", &shape)?;
        let mut words = self.stream();
        let t = with_element!(dtype, T, {
            Tensor::from_fn_overwrite::<T>(&shape, device, |out| {
                for o in out.iter_mut() {
                    let x = (words.next() as u128) | ((words.next() as u128) << 32);
                    // Multiply-shift maps 64 random bits onto the span with negligible bias.
                    let v = low as i128 + ((x * span) >> 64) as i128;
                    *o = T::from_i64(v as i64);
                }
                Ok(())
            })
        })?;
        self.advance(n as u128 * 2);
        Ok(t)
    }

    /// A random permutation of `0..n` (`torch.randperm`): Fisher-Yates with multiply-shift
    /// draws, in any dtype that holds `n - 1` exactly (integers and floats; bool up to 2).
    pub fn randperm(&mut self, n: usize, dtype: DType, device: &Device) -> Result<Tensor> {
        crate::observe::refuse_random("randperm")?;
        let last = n.saturating_sub(1) as i64;
        let exact = with_element!(dtype, T, T::from_i64(last).to_i64() == last);
        if !exact || i64::try_from(n).is_err() {
            return Err(Error::invalid_argument(
                "randperm",
                format!("{dtype} cannot hold every value below {n}"),
            ));
        }
        let mut words = self.stream();
        let t = with_element!(dtype, T, {
            Tensor::from_fn_overwrite::<T>(&[n], device, |out| {
                for (i, o) in out.iter_mut().enumerate() {
                    *o = T::from_i64(i as i64);
                }
                for i in (1..n).rev() {
                    let x = (words.next() as u128) | ((words.next() as u128) << 32);
                    let j = ((x * (i as u128 + 1)) >> 64) as usize;
                    out.swap(i, j);
                }
                Ok(())
            })
        })?;
        self.advance(n.saturating_sub(1) as u128 * 2);
        Ok(t)
    }
}

/// Random bits per uniform sample of a float dtype: as many as its mantissa holds.
fn mantissa_bits(dtype: DType) -> u32 {
    match dtype {
        DType::F64 => 53,
        DType::F16 => 11,
        DType::BF16 => 8,
        _ => 24,
    }
}

/// 32-bit words one uniform sample of `bits` bits uses.
fn words_per_uniform(bits: u32) -> u128 {
    if bits > 32 { 2 } else { 1 }
}

/// The generator's 32-bit words in order, computed a block of four at a time as they are used,
/// so no sample needs memory beyond the tensor it fills.
struct Words {
    key: [u32; 2],
    block: u64,
    buf: [u32; 4],
    used: usize,
}

impl Words {
    fn new(seed: u64, offset: u64) -> Words {
        Words {
            key: [seed as u32, (seed >> 32) as u32],
            block: offset,
            buf: [0; 4],
            used: 4,
        }
    }

    #[inline]
    fn next(&mut self) -> u32 {
        if self.used == 4 {
            let ctr = self.block;
            self.buf = philox4x32([ctr as u32, (ctr >> 32) as u32, 0, 0], self.key);
            self.block = self.block.wrapping_add(1);
            self.used = 0;
        }
        let w = self.buf[self.used];
        self.used += 1;
        w
    }

    /// One uniform value in [0, 1) with `bits` random bits, as f64.
    #[inline]
    fn uniform(&mut self, bits: u32) -> f64 {
        if bits > 32 {
            let hi = self.next() as u64;
            let lo = self.next() as u64;
            ((hi << 32 | lo) >> (64 - bits)) as f64 / (1u64 << bits) as f64
        } else {
            (self.next() >> (32 - bits)) as f64 / (1u64 << bits) as f64
        }
    }
}

impl Default for Generator {
    /// A generator seeded with 0.
    fn default() -> Self {
        Generator::new(0)
    }
}

fn float_only(op: &str, dtype: DType) -> Result<()> {
    if !dtype.is_float() {
        return Err(Error::UnsupportedDType {
            op: op.into(),
            given: dtype.to_string(),
            supported: "f16, bf16, f32, f64".into(),
        });
    }
    Ok(())
}

/// `Tensor::<name>(.., generator)`, PyTorch's spelling with an explicit generator: each
/// forwards to the generator's sampler of the same name.
macro_rules! sample_with_generator {
    ($($(#[$doc:meta])* $name:ident($($arg:ident: $ty:ty),*);)*) => {
        impl Tensor {$(
            $(#[$doc])*
            pub fn $name(
                $($arg: $ty,)*
                shape: impl IntoShape,
                dtype: DType,
                device: &Device,
                generator: &mut Generator,
            ) -> Result<Tensor> {
                generator.$name($($arg,)* shape, dtype, device)
            }
        )*}
    };
}

sample_with_generator! {
    /// Uniform samples in `[0, 1)` from `generator`.
    rand();
    /// Standard normal samples from `generator`.
    randn();
    /// Uniform integers in `[low, high)` from `generator`.
    randint(low: i64, high: i64);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn philox_known_answer() {
        // Known-answer vectors published with the Random123 library (philox4x32_10).
        assert_eq!(
            philox4x32([0, 0, 0, 0], [0, 0]),
            [0x6627_e8d5, 0xe169_c58d, 0xbc57_ac4c, 0x9b00_dbd8]
        );
        assert_eq!(
            philox4x32([u32::MAX; 4], [u32::MAX; 2]),
            [0x408f_276d, 0x41c8_3b0e, 0xa20b_c7c6, 0x6d54_51fd]
        );
    }

    #[test]
    fn same_seed_same_numbers() {
        let d = Device::cpu();
        let five = |g: &mut Generator| {
            g.rand([5], DType::F32, &d)
                .unwrap()
                .to_vec::<f32>()
                .unwrap()
        };
        let a = five(&mut Generator::new(42));
        let b = five(&mut Generator::new(42));
        let c = five(&mut Generator::new(43));
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert!(a.iter().all(|v| (0.0..1.0).contains(v)));
        let mut g = Generator::new(42);
        let first = five(&mut g);
        let second = five(&mut g);
        assert_eq!(first, a);
        assert_ne!(first, second);
    }

    #[test]
    fn randperm_is_a_seeded_permutation() {
        let d = Device::cpu();
        let perm = |seed: u64, n: usize| {
            Generator::new(seed)
                .randperm(n, DType::I64, &d)
                .unwrap()
                .to_vec::<i64>()
                .unwrap()
        };
        for n in [0, 1, 2, 7, 1000] {
            let mut p = perm(5, n);
            assert_eq!(p, perm(5, n), "seeded");
            p.sort_unstable();
            assert_eq!(p, (0..n as i64).collect::<Vec<_>>(), "a permutation of {n}");
        }
        assert_ne!(perm(5, 1000), perm(6, 1000));
        assert_ne!(perm(5, 1000), (0..1000).collect::<Vec<i64>>());
        // Every position takes every value about equally often.
        let mut first = [0usize; 4];
        for seed in 0..4000 {
            first[perm(seed, 4)[0] as usize] += 1;
        }
        assert!(first.iter().all(|&c| (850..1150).contains(&c)), "{first:?}");
        let mut g = Generator::new(1);
        let a = g.randperm(10, DType::F32, &d).unwrap();
        assert_ne!(g.offset(), 0, "the generator advances");
        assert_eq!(a.dtype(), DType::F32);
        assert!(g.randperm(300, DType::U8, &d).is_err());
        assert!(g.randperm(258, DType::BF16, &d).is_err());
        assert!(g.randperm(2, DType::Bool, &d).is_ok());
    }

    #[test]
    fn normal_moments_and_int_range() {
        let d = Device::cpu();
        let mut g = Generator::new(7);
        let x = g
            .randn([20000], DType::F64, &d)
            .unwrap()
            .to_vec::<f64>()
            .unwrap();
        let mean = x.iter().sum::<f64>() / x.len() as f64;
        let var = x.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / x.len() as f64;
        assert!(
            mean.abs() < 0.03 && (var - 1.0).abs() < 0.05,
            "{mean} {var}"
        );
        let r = g
            .randint(-3, 4, [1000], DType::I64, &d)
            .unwrap()
            .to_vec::<i64>()
            .unwrap();
        assert!(r.iter().all(|v| (-3..4).contains(v)));
        for v in -3..4 {
            assert!(r.contains(&v));
        }
        assert!(g.randint(3, 3, [1], DType::I64, &d).is_err());
        assert!(g.rand([1], DType::I32, &d).is_err());
        let b = g
            .rand([1000], DType::BF16, &d)
            .unwrap()
            .to_dtype(DType::F32)
            .unwrap();
        assert!(
            b.to_vec::<f32>()
                .unwrap()
                .iter()
                .all(|v| (0.0..1.0).contains(v))
        );
    }
}
