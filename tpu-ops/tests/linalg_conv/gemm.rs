//! `tpu_ops::cpu::simd::gemm` against a naive f64 reference, at every level of kernels the
//! processor has (AVX-512, AVX2) and the portable one: sizes on either side of the register tile and cache
//! blocks, transposed and strided operands, accumulation, and 16-bit outputs rounded once.

use proptest::prelude::*;
use tpu_ops::cpu::isa::{Level, with_level};
use tpu_ops::cpu::simd::{
    Elem, MatView, PackedPanels, gemm, gemm_bias, gemm_packed, gemm_packed_bias, gemm_update_f32,
    gemm_update_f32_in_place,
};
use tpu_tensor::{bf16, f16};

/// Sizes around the 12x32 and 6x16 tiles and the 16-lane vectors.
const SIZES: [usize; 6] = [1, 7, 17, 63, 65, 257];
/// Sizes of `k`: also past the 512-step blocks of bf16 and the 1024-step ones of f32.
const K_SIZES: [usize; 9] = [1, 7, 17, 63, 65, 257, 513, 1025, 2049];

/// How an operand lies in its storage.
#[derive(Clone, Copy, Debug)]
enum Lay {
    /// Dense rows.
    RowMajor,
    /// Dense columns (a transposed matrix).
    ColMajor,
    /// Rows of stride 1 with a gap between them (a slice of a wider matrix).
    Padded,
    /// Neither stride 1: every other element of every other row of a wider matrix.
    Strided,
    /// Dense columns with a gap between them.
    ColPadded,
    /// One dense row repeated (row stride 0, an expanded row vector).
    RowRepeated,
    /// One dense column repeated (column stride 0).
    ColRepeated,
}

/// A matrix of `rows x cols` laid out as `lay` after `offset` unused elements, filled from
/// `values` (cycled).
fn matrix<T: Elem>(
    rows: usize,
    cols: usize,
    lay: Lay,
    offset: usize,
    values: &[f32],
) -> (Vec<T>, usize, usize) {
    let (rs, cs) = match lay {
        Lay::RowMajor => (cols, 1),
        Lay::ColMajor => (1, rows),
        Lay::Padded => (cols + 3, 1),
        Lay::Strided => (4 * cols + 1, 2),
        Lay::ColPadded => (1, rows + 5),
        Lay::RowRepeated => (0, 1),
        Lay::ColRepeated => (1, 0),
    };
    let len = offset + (rows - 1) * rs + (cols - 1) * cs + 1;
    // Elements outside the matrix hold NaN, so reading one shows in the result.
    let mut data = vec![T::from_f32(f32::NAN); len];
    for i in 0..rows {
        for j in 0..cols {
            data[offset + i * rs + j * cs] = T::from_f32(values[(i * cols + j) % values.len()]);
        }
    }
    (data, rs, cs)
}

fn view<T>(
    data: &[T],
    offset: usize,
    rows: usize,
    cols: usize,
    rs: usize,
    cs: usize,
) -> MatView<'_, T> {
    MatView {
        data,
        offset,
        rows,
        cols,
        rs,
        cs,
    }
}

/// `a · b (+ c)` in f64 with the sum of absolute products of each element (for the bound).
fn reference<I: Elem, O: Elem>(
    a: &MatView<'_, I>,
    b: &MatView<'_, I>,
    c: Option<&[O]>,
) -> (Vec<f64>, Vec<f64>) {
    let (m, k, n) = (a.rows, a.cols, b.cols);
    let at = |v: &MatView<'_, I>, i: usize, j: usize| {
        v.data[v.offset + i * v.rs + j * v.cs].to_f32() as f64
    };
    let mut want = vec![0.0; m * n];
    let mut mag = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            let (mut s, mut g) = match c {
                Some(c) => {
                    let x = c[i * n + j].to_f32() as f64;
                    (x, x.abs())
                }
                None => (0.0, 0.0),
            };
            for p in 0..k {
                let x = at(a, i, p) * at(b, p, j);
                s += x;
                g += x.abs();
            }
            want[i * n + j] = s;
            mag[i * n + j] = g;
        }
    }
    (want, mag)
}

/// Half the distance between adjacent `O` values around `x`, 0 for f32 outputs.
fn half_ulp<O: Elem>(x: f64) -> f64 {
    let bits = match std::mem::size_of::<O>() {
        4 => return 0.0,
        _ if O::from_f32(1.0 + 1.0 / 1024.0).to_f32() != 1.0 => 11, // f16
        _ => 8,                                                     // bf16
    };
    let e = x.abs().max(f64::MIN_POSITIVE).log2().floor();
    // f16 subnormals have the spacing of the smallest normal.
    let e = if bits == 11 { e.max(-14.0) } else { e };
    (e - bits as f64 + 1.0).exp2() / 2.0
}

#[derive(Clone, Debug)]
struct Case {
    m: usize,
    k: usize,
    n: usize,
    la: Lay,
    lb: Lay,
    offset: usize,
    accumulate: bool,
    threads: usize,
    values: Vec<f32>,
}

fn lay() -> impl Strategy<Value = Lay> {
    prop_oneof![
        Just(Lay::RowMajor),
        Just(Lay::ColMajor),
        Just(Lay::Padded),
        Just(Lay::Strided),
        Just(Lay::ColPadded),
    ]
}

fn case() -> impl Strategy<Value = Case> {
    let size = || prop::sample::select(SIZES.to_vec());
    (
        (size(), prop::sample::select(K_SIZES.to_vec()), size()),
        (lay(), lay(), 0usize..3, any::<bool>(), 1usize..=2),
        prop::collection::vec(-2.0f32..2.0, 1..64),
    )
        .prop_map(
            |((m, k, n), (la, lb, offset, accumulate, threads), values)| Case {
                m,
                k,
                n,
                la,
                lb,
                offset,
                accumulate,
                threads,
                values,
            },
        )
}

/// Runs `case` with `I` inputs and `O` outputs at `level` and checks every element against the
/// reference: within the f32 accumulation bound plus half an output ulp (one rounding). With
/// `specials`, special values are first scattered over the operands (see [`scatter_specials`]):
/// then NaN exactly where the f64 reference is NaN (a NaN operand, 0 · inf, or inf - inf in the
/// sum), and the same infinity where it is infinite.
fn check<I: Elem, O: Elem>(
    case: &Case,
    specials: Option<u64>,
    level: Level,
) -> Result<(), TestCaseError> {
    let (m, k, n) = (case.m, case.k, case.n);
    let (mut da, ars, acs) = matrix::<I>(m, k, case.la, case.offset, &case.values);
    let rev: Vec<f32> = case.values.iter().rev().map(|x| x * 0.75).collect();
    let (mut db, brs, bcs) = matrix::<I>(k, n, case.lb, case.offset, &rev);
    if let Some(seed) = specials {
        scatter_specials(
            seed,
            (&mut da, ars, acs),
            (&mut db, brs, bcs),
            case.offset,
            (m, k, n),
        );
    }
    let a = view(&da, case.offset, m, k, ars, acs);
    let b = view(&db, case.offset, k, n, brs, bcs);
    let mut c: Vec<O> = (0..m * n)
        .map(|i| {
            O::from_f32(if case.accumulate {
                (i % 13) as f32 - 6.0
            } else {
                f32::NAN
            })
        })
        .collect();
    let (want, mag) = reference(&a, &b, case.accumulate.then_some(c.as_slice()));
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(case.threads)
        .build()
        .expect("a thread pool");
    with_level(level, || {
        pool.install(|| gemm(a, b, &mut c, case.accumulate, case.threads))
    })
    .map_err(|e| TestCaseError::fail(e.to_string()))?;
    for (idx, ((got, want), mag)) in c.iter().zip(&want).zip(&mag).enumerate() {
        let got = got.to_f32() as f64;
        let at = format!(
            "{level:?} element ({}, {}) of {m}x{k}x{n}: got {got}, want {want}",
            idx / n,
            idx % n
        );
        if want.is_nan() {
            prop_assert!(got.is_nan(), "{}", at);
        } else if want.is_infinite() {
            prop_assert!(got == *want, "{}", at);
        } else {
            let tol = (k as f64 + 2.0) * f32::EPSILON as f64 * mag + half_ulp::<O>(*want) + 1e-30;
            prop_assert!((got - want).abs() <= tol, "{} (tolerance {})", at, tol);
        }
    }
    Ok(())
}

/// The levels this processor runs: each kernel family it has, and the portable path.
fn levels() -> Vec<Level> {
    let top = tpu_ops::cpu::isa::detected_level();
    [Level::Avx512, Level::Avx2, Level::Portable]
        .into_iter()
        .filter(|&l| l <= top)
        .collect()
}

fn both_levels<I: Elem, O: Elem>(case: &Case) -> Result<(), TestCaseError> {
    for level in levels() {
        check::<I, O>(case, None, level)?;
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(tpu_ops::testing::proptest_cases(48)))]

    #[test]
    fn f32_products_match_the_reference(c in case()) {
        both_levels::<f32, f32>(&c)?;
    }

    #[test]
    fn bf16_products_match_the_reference(c in case()) {
        both_levels::<bf16, bf16>(&c)?;
        both_levels::<bf16, f32>(&c)?;
    }

    #[test]
    fn f16_products_match_the_reference(c in case()) {
        both_levels::<f16, f16>(&c)?;
        both_levels::<f16, f32>(&c)?;
    }
}

/// `gemm_update_f32` (and its in-place form, `c` holding `w`) against the product written out
/// and then updated, `w + (c * alpha)`: the same bits where it takes the one-pass path, and
/// `c` untouched where it declines.
fn update_matches(case: &Case, level: Level) -> Result<(), TestCaseError> {
    let (m, k, n) = (case.m, case.k, case.n);
    let (da, ars, acs) = matrix::<f32>(m, k, case.la, case.offset, &case.values);
    let rev: Vec<f32> = case.values.iter().rev().map(|x| x * 0.75).collect();
    let (db, brs, bcs) = matrix::<f32>(k, n, case.lb, case.offset, &rev);
    let a = view(&da, case.offset, m, k, ars, acs);
    let b = view(&db, case.offset, k, n, brs, bcs);
    let w: Vec<f32> = (0..m * n).map(|i| (i % 11) as f32 * 0.37 - 2.0).collect();
    let alpha = -0.013f32;
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(case.threads)
        .build()
        .unwrap();
    let (mut want, mut got) = (vec![0.0f32; m * n], vec![f32::NAN; m * n]);
    let mut in_place = w.clone();
    let (done, done_in_place) = with_level(level, || {
        pool.install(|| {
            gemm(a, b, &mut want, false, case.threads).unwrap();
            (
                gemm_update_f32(a, b, &w, alpha, &mut got, case.threads).unwrap(),
                gemm_update_f32_in_place(a, b, alpha, &mut in_place, case.threads).unwrap(),
            )
        })
    });
    prop_assert_eq!(done, done_in_place);
    if !done {
        prop_assert!(got.iter().all(|x| x.is_nan()), "declined but wrote c");
        prop_assert!(in_place == w, "declined but wrote c in place");
        // The one-pass path runs wherever packed kernels do.
        prop_assert!(level == Level::Portable || k > 1024 || m == 1 || n == 1);
        return Ok(());
    }
    for (want, &w) in want.iter_mut().zip(&w) {
        *want = w + *want * alpha;
    }
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    prop_assert_eq!(bits(&got), bits(&want), "{:?}", case);
    prop_assert_eq!(bits(&in_place), bits(&want), "in place: {:?}", case);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(tpu_ops::testing::proptest_cases(48)))]

    /// The product with an SGD-style update in its store keeps the bits of the product
    /// followed by the update, at every size, layout and thread count, and declines (leaving
    /// `c` alone) where one pass cannot keep them.
    #[test]
    fn an_update_in_the_products_store_keeps_the_bits(c in case()) {
        for level in levels() {
            update_matches(&c, level)?;
        }
    }
}

/// `gemm_packed` with panels packed once from `b` against `gemm` with `b` itself: the same
/// bits wherever `gemm` takes its packed kernels (not a matrix-vector product), also when the panels
/// are reused for a second product; declined (with `c` untouched) where the panels suit
/// other kernels than the level allows.
fn packed_matches<I: Elem, O: Elem>(case: &Case, level: Level) -> Result<(), TestCaseError> {
    let (m, k, n) = (case.m, case.k, case.n);
    let (da, ars, acs) = matrix::<I>(m, k, case.la, case.offset, &case.values);
    let rev: Vec<f32> = case.values.iter().rev().map(|x| x * 0.75).collect();
    let (db, brs, bcs) = matrix::<I>(k, n, case.lb, case.offset, &rev);
    let a = view(&da, case.offset, m, k, ars, acs);
    let b = view(&db, case.offset, k, n, brs, bcs);
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(case.threads)
        .build()
        .unwrap();
    let start: Vec<O> = (0..m * n)
        .map(|i| O::from_f32((i % 13) as f32 - 6.0))
        .collect();
    let Some(panels) = with_level(level, || PackedPanels::pack(b)).unwrap() else {
        prop_assert_eq!(level, Level::Portable, "the packed kernels run, so pack");
        return Ok(());
    };
    prop_assert_eq!(panels.shape(), (k, n));
    let (mut want, mut got) = (start.clone(), start.clone());
    let done = with_level(level, || {
        pool.install(|| {
            gemm(a, b, &mut want, case.accumulate, case.threads).unwrap();
            let once = gemm_packed(a, &panels, &mut got, case.accumulate, case.threads).unwrap();
            // Reused: the panels are only read.
            got.clone_from(&start);
            once && gemm_packed(a, &panels, &mut got, case.accumulate, case.threads).unwrap()
        })
    });
    prop_assert!(done, "{:?} declined panels packed at its own level", level);
    let bits = |v: &[O]| v.iter().map(|x| x.to_f32().to_bits()).collect::<Vec<_>>();
    if m > 1 && n > 1 {
        prop_assert_eq!(bits(&got), bits(&want), "{:?} {:?}", level, case);
    }
    // Panels packed for wider kernels are declined, leaving `c` alone.
    if level == Level::Avx512 {
        let mut c = start.clone();
        let ran = with_level(Level::Avx2, || gemm_packed(a, &panels, &mut c, false, 1)).unwrap();
        prop_assert!(!ran && bits(&c) == bits(&start), "declined at AVX2");
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(tpu_ops::testing::proptest_cases(32)))]

    /// A right operand packed once gives the bits of the product that packs it each time, at
    /// every size, layout, thread count and dtype.
    #[test]
    fn panels_packed_once_give_the_products_bits(c in case()) {
        for level in levels() {
            packed_matches::<f32, f32>(&c, level)?;
            packed_matches::<bf16, bf16>(&c, level)?;
            packed_matches::<bf16, f32>(&c, level)?;
            packed_matches::<f16, f16>(&c, level)?;
        }
    }
}

/// `gemm_bias` (and `gemm_packed_bias`) against the product accumulated onto its output
/// filled with the bias first: the same bits, at every size, layout (the swapped `x · Wᵀ`
/// product and matrix-vector routes included), thread count and dtype, 16-bit outputs whose
/// `k` spans several blocks too.
fn bias_matches<I: Elem, O: Elem>(case: &Case, level: Level) -> Result<(), TestCaseError> {
    let (m, k, n) = (case.m, case.k, case.n);
    let (da, ars, acs) = matrix::<I>(m, k, case.la, case.offset, &case.values);
    let rev: Vec<f32> = case.values.iter().rev().map(|x| x * 0.75).collect();
    let (db, brs, bcs) = matrix::<I>(k, n, case.lb, case.offset, &rev);
    let a = view(&da, case.offset, m, k, ars, acs);
    let b = view(&db, case.offset, k, n, brs, bcs);
    let bias: Vec<O> = (0..n)
        .map(|j| O::from_f32((j % 7) as f32 * 0.61 - 1.5))
        .collect();
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(case.threads)
        .build()
        .unwrap();
    let filled: Vec<O> = (0..m * n).map(|i| bias[i % n]).collect();
    let bits = |v: &[O]| v.iter().map(|x| x.to_f32().to_bits()).collect::<Vec<_>>();
    let (mut want, mut got) = (filled.clone(), vec![O::from_f32(f32::NAN); m * n]);
    with_level(level, || {
        pool.install(|| {
            gemm(a, b, &mut want, true, case.threads).unwrap();
            gemm_bias(a, b, &bias, &mut got, case.threads).unwrap();
        })
    });
    prop_assert_eq!(bits(&got), bits(&want), "{:?} {:?}", level, case);
    let Some(panels) = with_level(level, || PackedPanels::pack(b)).unwrap() else {
        return Ok(());
    };
    let (mut want, mut got) = (filled, vec![O::from_f32(f32::NAN); m * n]);
    let done = with_level(level, || {
        pool.install(|| {
            gemm_packed(a, &panels, &mut want, true, case.threads).unwrap()
                && gemm_packed_bias(a, &panels, &bias, &mut got, case.threads).unwrap()
        })
    });
    prop_assert!(done, "{:?} declined panels packed at its own level", level);
    prop_assert_eq!(bits(&got), bits(&want), "packed, {:?} {:?}", level, case);
    // A bias of another length is refused.
    let mut c = vec![O::from_f32(0.0); m * n];
    prop_assert!(gemm_bias(a, b, &bias[..n - 1], &mut c, 1).is_err());
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(tpu_ops::testing::proptest_cases(32)))]

    /// A bias added as the tiles are stored keeps the bits of the output filled with it first.
    #[test]
    fn a_bias_in_the_products_store_keeps_the_bits(c in case()) {
        for level in levels() {
            bias_matches::<f32, f32>(&c, level)?;
            bias_matches::<bf16, bf16>(&c, level)?;
            bias_matches::<bf16, f32>(&c, level)?;
            bias_matches::<f16, f16>(&c, level)?;
        }
    }
}

/// Every layout, the stride-0 ones included.
fn any_lay() -> impl Strategy<Value = Lay> {
    prop_oneof![lay(), Just(Lay::RowRepeated), Just(Lay::ColRepeated)]
}

/// Writes special values (+inf, -inf, NaN, -0.0, 0.0, chosen from `seed`) over elements of
/// `a` and `b`: pairs in a column of `a` and the same row of `b` (the first, the last and one
/// more), so that they meet in the sums (inf times 0, inf plus -inf), and some anywhere.
fn scatter_specials<T: Elem>(
    seed: u64,
    (a, ars, acs): (&mut [T], usize, usize),
    (b, brs, bcs): (&mut [T], usize, usize),
    offset: usize,
    (m, k, n): (usize, usize, usize),
) {
    let mut s = seed | 1;
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    let special = |r: u64| {
        let v = [f32::INFINITY, f32::NEG_INFINITY, f32::NAN, -0.0, 0.0][(r % 5) as usize];
        T::from_f32(v)
    };
    // The first or the last index below `len` (the edges of the tiles, of the groups and
    // blocks of k and of the padded pairs of bf16 steps), or any.
    let index = |len: usize, r: u64| match r % 3 {
        0 => 0,
        1 => len - 1,
        _ => ((r / 3) % len as u64) as usize,
    };
    for p in [0, k - 1, index(k, next())] {
        let (i, j) = (index(m, next()), index(n, next()));
        a[offset + i * ars + p * acs] = special(next());
        b[offset + p * brs + j * bcs] = special(next());
    }
    for _ in 0..next() % 3 {
        let (i, p, j) = (index(m, next()), index(k, next()), index(n, next()));
        a[offset + i * ars + p * acs] = special(next());
        b[offset + p * brs + j * bcs] = special(next());
    }
}

fn specials_both_levels<I: Elem, O: Elem>(case: &Case, seed: u64) -> Result<(), TestCaseError> {
    for level in levels() {
        check::<I, O>(case, Some(seed), level)?;
    }
    Ok(())
}

fn special_case() -> impl Strategy<Value = (Case, u64)> {
    (case(), any_lay(), any_lay(), any::<u64>()).prop_map(|(mut c, la, lb, seed)| {
        c.la = la;
        c.lb = lb;
        (c, seed)
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(tpu_ops::testing::proptest_cases(20)))]

    /// ±inf, NaN and -0.0 in the operands give IEEE results: the zero padding of the packed
    /// panels (sizes off the 12x32 tile, odd k for the bf16 pairs), the matrix-vector paths
    /// and stride-0 operands never multiply an infinity by a zero the sum does not have.
    #[test]
    fn special_values_give_ieee_results((c, seed) in special_case()) {
        specials_both_levels::<f32, f32>(&c, seed)?;
        specials_both_levels::<bf16, bf16>(&c, seed)?;
        specials_both_levels::<bf16, f32>(&c, seed)?;
        specials_both_levels::<f16, f16>(&c, seed)?;
        specials_both_levels::<f16, f32>(&c, seed)?;
    }
}

/// Inputs whose f32 sums are exact (small non-negative integers below `ra` and `rb`), so a
/// 16-bit result must be the exact sum rounded once to nearest even, also when `k` spans
/// several cache blocks (past 1024 steps for the f32 kernel, 2048 for bf16's) whose partial
/// sums must not be rounded on the way.
fn rounds_once<T: Elem>(level: Level, ra: usize, rb: usize, k: usize) {
    let (m, n) = (13, 35);
    let va: Vec<f32> = (0..m * k).map(|i| ((i * 7919) % ra) as f32).collect();
    let vb: Vec<f32> = (0..k * n).map(|i| ((i * 104_729) % rb) as f32).collect();
    for accumulate in [false, true] {
        let (da, _, _) = matrix::<T>(m, k, Lay::RowMajor, 0, &va);
        let (db, _, _) = matrix::<T>(k, n, Lay::RowMajor, 0, &vb);
        let a = view(&da, 0, m, k, k, 1);
        let b = view(&db, 0, k, n, n, 1);
        let mut c: Vec<T> = (0..m * n).map(|i| T::from_f32(i as f32 * 3.0)).collect();
        let (want, _) = reference(&a, &b, accumulate.then_some(c.as_slice()));
        with_level(level, || gemm(a, b, &mut c, accumulate, 1)).expect("a product");
        let mut rounded = 0;
        for (got, want) in c.iter().zip(&want) {
            let exact = T::from_f32(*want as f32).to_f32();
            assert_eq!(got.to_f32(), exact, "{level:?}: {want} rounds to {exact}");
            rounded += usize::from(exact as f64 != *want);
        }
        assert!(rounded > m * n / 4, "the sums should need rounding");
    }
}

#[test]
fn bf16_results_are_rounded_once() {
    for level in levels() {
        rounds_once::<bf16>(level, 31, 29, 2100);
    }
}

#[test]
fn f16_results_are_rounded_once() {
    // Sums stay below f16's largest value.
    for level in levels() {
        rounds_once::<f16>(level, 9, 8, 1100);
    }
}

/// Products large enough for several row and column blocks and both threads.
#[test]
fn large_products_match_the_reference() {
    // Past the row blocks of the f32 and AVX-512 bf16 kernels (120, 42) and the column block
    // (2048); `k` blocks are covered by the proptests' sizes and `rounds_once`.
    let c = Case {
        m: 250,
        k: 600,
        n: 2100,
        la: Lay::ColMajor,
        lb: Lay::RowMajor,
        offset: 1,
        accumulate: true,
        threads: 2,
        values: (0..97).map(|i| (i as f32 * 0.37).sin()).collect(),
    };
    both_levels::<f32, f32>(&c).expect("f32");
    both_levels::<bf16, bf16>(&c).expect("bf16");
    // Past the row block of the AMX kernel (384 rows a thread) and its block of `k` (2048),
    // a last panel of 6 columns.
    let c = Case {
        m: 900,
        k: 2100,
        n: 70,
        la: Lay::RowMajor,
        lb: Lay::ColMajor,
        offset: 0,
        accumulate: false,
        threads: 2,
        values: (0..89).map(|i| (i as f32 * 0.29).cos()).collect(),
    };
    both_levels::<bf16, bf16>(&c).expect("bf16, many row blocks");
    both_levels::<bf16, f32>(&c).expect("bf16 into f32, many row blocks");
}

/// `a · b` on `threads` threads of a pool of their own.
fn product_on<I: Elem, O: Elem>(
    level: Level,
    a: MatView<'_, I>,
    b: MatView<'_, I>,
    threads: usize,
) -> Vec<O> {
    let mut c = vec![O::from_f32(f32::NAN); a.rows * b.cols];
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .expect("a thread pool");
    with_level(level, || {
        pool.install(|| gemm(a, b, &mut c, false, threads))
    })
    .expect("a product");
    c
}

/// Products split by rows pack all of `b` once, the threads sharing the packing, and every
/// part reads those panels: the bits are those of one thread, which packs its own (f32, bf16
/// into bf16 and f32; `k` in one block and in two; a last panel of 24 columns; parts of 4 and
/// 5 panels, and of 3). The first case is also checked against the reference.
#[test]
fn panels_shared_by_the_threads_keep_the_bits_of_one() {
    fn case<I: Elem, O: Elem>(level: Level, k: usize, reference_too: bool) {
        let (m, n) = (300, 280);
        let va: Vec<f32> = (0..211).map(|i| (i as f32 * 0.37).sin()).collect();
        let vb: Vec<f32> = (0..193).map(|i| (i as f32 * 0.53).cos()).collect();
        let (da, ars, acs) = matrix::<I>(m, k, Lay::RowMajor, 0, &va);
        let (db, brs, bcs) = matrix::<I>(k, n, Lay::RowMajor, 0, &vb);
        let a = view(&da, 0, m, k, ars, acs);
        let b = view(&db, 0, k, n, brs, bcs);
        let one: Vec<O> = product_on(level, a, b, 1);
        for threads in [2, 3] {
            let many: Vec<O> = product_on(level, a, b, threads);
            let differ = one
                .iter()
                .zip(&many)
                .position(|(x, y)| x.to_f32().to_bits() != y.to_f32().to_bits());
            assert_eq!(differ, None, "{level:?} {m}x{k}x{n} on {threads} threads");
        }
        if reference_too {
            let (want, mag) = reference::<I, O>(&a, &b, None);
            for (idx, ((got, want), mag)) in one.iter().zip(&want).zip(&mag).enumerate() {
                let tol = (k as f64 + 2.0) * f32::EPSILON as f64 * mag + half_ulp::<O>(*want);
                let got = got.to_f32() as f64;
                assert!(
                    (got - want).abs() <= tol,
                    "{level:?} element {idx}: {got} vs {want}"
                );
            }
        }
    }
    for level in levels() {
        case::<f32, f32>(level, 500, true);
        case::<f32, f32>(level, 1100, false);
        case::<bf16, bf16>(level, 1000, true);
        case::<bf16, bf16>(level, 2100, false);
        case::<bf16, f32>(level, 1000, false);
    }
}

/// `x · Wᵀ` as `linear` reads it (computed swapped, `(W · xᵀ)ᵀ`, with transposed tiles) and a
/// product whose `a` rows are 4 KiB apart (read through a copy, since they share L1 sets):
/// within the reference's bound, and bit for bit the product of the same operands laid out
/// with a stride that takes neither path.
#[test]
fn transposed_weights_and_aliasing_rows_keep_the_bits() {
    let values: Vec<f32> = (0..101).map(|i| (i as f32 * 0.61).cos()).collect();
    // (m, k, n, a's row stride, b read transposed, accumulate)
    let cases = [
        (128, 1024, 1024, 1024, true, true),
        (128, 784, 1024, 784, true, false),
        // A classifier's head: ten columns, swapped onto the tile's rows.
        (128, 1024, 10, 1024, true, false),
        (37, 1025, 300, 1025, true, true),
        (64, 1024, 100, 1024, false, false),
        (100, 2048, 70, 2048, false, true),
    ];
    for (m, k, n, lda, bt, accumulate) in cases {
        let fill = |rows: usize, cols: usize, ld: usize, shift: usize| {
            let mut d = vec![f32::NAN; (rows - 1) * ld + cols];
            for i in 0..rows {
                for j in 0..cols {
                    d[i * ld + j] = values[(i * cols + j + shift) % values.len()];
                }
            }
            d
        };
        // `b` as stored: `[n, k]` rows when read transposed, else `[k, n]`.
        let db = if bt {
            fill(n, k, k, 7)
        } else {
            fill(k, n, n, 7)
        };
        let b = if bt {
            view(&db, 0, k, n, 1, k)
        } else {
            view(&db, 0, k, n, n, 1)
        };
        let start: Vec<f32> = (0..m * n).map(|i| (i % 11) as f32 - 5.0).collect();
        let mut results = Vec::new();
        for ld in [lda, k + 3] {
            let da = fill(m, k, ld, 0);
            let a = view(&da, 0, m, k, ld, 1);
            let mut c = start.clone();
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(2)
                .build()
                .unwrap();
            with_level(tpu_ops::cpu::isa::detected_level(), || {
                pool.install(|| gemm(a, b, &mut c, accumulate, 2))
            })
            .unwrap();
            let (want, mag) = reference(&a, &b, accumulate.then_some(start.as_slice()));
            for (idx, ((got, want), mag)) in c.iter().zip(&want).zip(&mag).enumerate() {
                let tol = (k as f64 + 2.0) * f32::EPSILON as f64 * mag + 1e-30;
                assert!(
                    (*got as f64 - want).abs() <= tol,
                    "{m}x{k}x{n} lda {ld} element {idx}: got {got}, want {want}"
                );
            }
            results.push(c.iter().map(|x| x.to_bits()).collect::<Vec<_>>());
            // A bias added in the store (in registers, transposed, for `x · Wᵀ`) keeps the
            // bits of the output filled with it first.
            let bias: Vec<f32> = (0..n).map(|j| (j % 9) as f32 * 0.3 - 1.0).collect();
            let mut want: Vec<f32> = (0..m * n).map(|i| bias[i % n]).collect();
            let mut got = vec![f32::NAN; m * n];
            with_level(tpu_ops::cpu::isa::detected_level(), || {
                pool.install(|| {
                    gemm(a, b, &mut want, true, 2).unwrap();
                    gemm_bias(a, b, &bias, &mut got, 2).unwrap();
                })
            });
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&want), "{m}x{k}x{n} lda {ld}: the bias");
        }
        assert_eq!(
            results[0], results[1],
            "{m}x{k}x{n}: the bits depend on a's stride"
        );
        if bt {
            // The same `b` stored `[k, n]`: the straight product, packed as usual.
            let mut dense = vec![0f32; k * n];
            for p in 0..k {
                for j in 0..n {
                    dense[p * n + j] = db[j * k + p];
                }
            }
            let da = fill(m, k, lda, 0);
            let mut c = start.clone();
            with_level(tpu_ops::cpu::isa::detected_level(), || {
                gemm(
                    view(&da, 0, m, k, lda, 1),
                    view(&dense, 0, k, n, n, 1),
                    &mut c,
                    accumulate,
                    1,
                )
            })
            .unwrap();
            let bits: Vec<u32> = c.iter().map(|x| x.to_bits()).collect();
            assert_eq!(bits, results[0], "{m}x{k}x{n}: swapped and straight differ");
        }
    }
}

#[test]
fn bad_views_are_errors() {
    let data = vec![1.0f32; 10];
    let a = view(&data, 0, 3, 4, 4, 1);
    let b = view(&data, 0, 4, 2, 2, 1);
    let mut c = vec![0.0f32; 6];
    assert!(
        gemm(a, b, &mut c, false, 1).is_err(),
        "a leaves its storage"
    );
    let a = view(&data, 0, 2, 2, 2, 1);
    let mut c = vec![0.0f32; 5];
    assert!(
        gemm(a, b, &mut c, false, 1).is_err(),
        "c has the wrong size"
    );
}
