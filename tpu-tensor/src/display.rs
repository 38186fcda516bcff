//! Printing tensors the way PyTorch does.
//!
//! The rules follow PyTorch's `_tensor_str`: one width for every element, floats as whole numbers
//! with a trailing dot when all are integral, fixed notation with 4 decimals, or scientific
//! notation when magnitudes span more than 1000x (or exceed 1e8, or go below 1e-4); tensors with
//! more than 1000 elements show 3 items at each edge of every dim; lines wrap at 80 columns.

use std::fmt;

use tpu_runtime::error::join_display;
use tpu_runtime::{DType, Result, with_element};

use crate::tensor::Tensor;

const THRESHOLD: usize = 1000;
const EDGE_ITEMS: usize = 3;
const LINE_WIDTH: usize = 80;
const PRECISION: usize = 4;

#[derive(Clone, Copy)]
enum Value {
    Float(f64),
    Int(i64),
    Bool(bool),
}

struct Formatter {
    float: bool,
    int_mode: bool,
    sci_mode: bool,
    max_width: usize,
}

/// Python's `{:.Ne}`: mantissa, `e`, sign and at least two exponent digits.
fn sci(v: f64, precision: usize) -> String {
    if !v.is_finite() {
        return nonfinite(v);
    }
    let s = format!("{v:.precision$e}");
    let (mantissa, exp) = s.split_once('e').unwrap_or((&s, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let sign = if exp < 0 { '-' } else { '+' };
    format!("{mantissa}e{sign}{:02}", exp.abs())
}

fn nonfinite(v: f64) -> String {
    if v.is_nan() {
        "nan".into()
    } else if v > 0.0 {
        "inf".into()
    } else {
        "-inf".into()
    }
}

fn fixed(v: f64, precision: usize) -> String {
    if !v.is_finite() {
        return nonfinite(v);
    }
    format!("{v:.precision$}")
}

impl Formatter {
    fn new(values: &[Value], float: bool) -> Formatter {
        let mut f = Formatter {
            float,
            int_mode: true,
            sci_mode: false,
            max_width: 1,
        };
        if !float {
            for v in values {
                f.max_width = f.max_width.max(Formatter::plain(*v).len());
            }
            return f;
        }
        let finite: Vec<f64> = values
            .iter()
            .filter_map(|v| match v {
                Value::Float(x) if x.is_finite() && *x != 0.0 => Some(*x),
                _ => None,
            })
            .collect();
        if finite.is_empty() {
            return f;
        }
        let min = finite.iter().fold(f64::INFINITY, |a, v| a.min(v.abs()));
        let max = finite.iter().fold(0.0f64, |a, v| a.max(v.abs()));
        f.int_mode = finite.iter().all(|v| v.ceil() == *v);
        if f.int_mode {
            if max / min > 1000.0 || max > 1.0e8 {
                f.sci_mode = true;
                for v in &finite {
                    f.max_width = f.max_width.max(sci(*v, PRECISION).len());
                }
            } else {
                for v in &finite {
                    f.max_width = f.max_width.max(format!("{v:.0}").len() + 1);
                }
            }
        } else if max / min > 1000.0 || max > 1.0e8 || min < 1.0e-4 {
            f.sci_mode = true;
            for v in &finite {
                f.max_width = f.max_width.max(sci(*v, PRECISION).len());
            }
        } else {
            for v in &finite {
                f.max_width = f.max_width.max(fixed(*v, PRECISION).len());
            }
        }
        f
    }

    fn plain(v: Value) -> String {
        match v {
            Value::Float(x) => fixed(x, PRECISION),
            Value::Int(i) => i.to_string(),
            Value::Bool(b) => if b { "True" } else { "False" }.to_string(),
        }
    }

    fn format(&self, v: Value) -> String {
        let s = match v {
            Value::Float(x) if self.float => {
                if self.sci_mode {
                    sci(x, PRECISION)
                } else if self.int_mode {
                    if x.is_finite() {
                        format!("{x:.0}.")
                    } else {
                        nonfinite(x)
                    }
                } else {
                    fixed(x, PRECISION)
                }
            }
            other => Formatter::plain(other),
        };
        format!("{s:>width$}", width = self.max_width)
    }
}

/// The tensor's elements as printable values, row-major.
fn values(t: &Tensor) -> Result<Vec<Value>> {
    let t = t.to_device(&tpu_runtime::Device::cpu())?;
    with_element!(t.dtype(), T, {
        let v = t.to_vec::<T>()?;
        // Several times the tensor's bytes, for a view that may cost nothing: checked.
        let mut out = tpu_runtime::memory::try_host_capacity(v.len(), || {
            format!(
                "printing {}",
                tpu_runtime::buffer::describe(t.dtype(), t.shape())
            )
        })?;
        out.extend(v.into_iter().map(|x| {
            use tpu_runtime::Element;
            match t.dtype() {
                DType::Bool => Value::Bool(x.to_i64() != 0),
                d if d.is_float() => Value::Float(x.to_f64()),
                _ => Value::Int(x.to_i64()),
            }
        }));
        Ok(out)
    })
}

/// Indices kept along a dim of `size` when summarising (`None` marks the ellipsis).
fn kept(size: usize, summarize: bool) -> Vec<Option<usize>> {
    if summarize && size > 2 * EDGE_ITEMS {
        (0..EDGE_ITEMS)
            .map(Some)
            .chain(std::iter::once(None))
            .chain((size - EDGE_ITEMS..size).map(Some))
            .collect()
    } else {
        (0..size).map(Some).collect()
    }
}

struct Printer<'a> {
    shape: &'a [usize],
    strides: Vec<usize>,
    values: &'a [Value],
    summarize: bool,
    fmt: Formatter,
}

impl Printer<'_> {
    fn summarized_values(
        shape: &[usize],
        strides: &[usize],
        values: &[Value],
        summarize: bool,
    ) -> Vec<Value> {
        fn rec(
            dim: usize,
            base: usize,
            shape: &[usize],
            strides: &[usize],
            values: &[Value],
            summarize: bool,
            out: &mut Vec<Value>,
        ) {
            if dim == shape.len() {
                out.push(values[base]);
                return;
            }
            for i in kept(shape[dim], summarize).into_iter().flatten() {
                rec(
                    dim + 1,
                    base + i * strides[dim],
                    shape,
                    strides,
                    values,
                    summarize,
                    out,
                );
            }
        }
        let mut out = Vec::new();
        rec(0, 0, shape, strides, values, summarize, &mut out);
        out
    }

    fn tensor_str(&self, dim: usize, base: usize, indent: usize) -> String {
        let rank = self.shape.len();
        if rank == 0 {
            return self.fmt.format(self.values[0]);
        }
        if dim == rank - 1 {
            return self.vector_str(base, indent);
        }
        let slices: Vec<String> = kept(self.shape[dim], self.summarize)
            .into_iter()
            .map(|i| match i {
                Some(i) => self.tensor_str(dim + 1, base + i * self.strides[dim], indent + 1),
                None => "...".to_string(),
            })
            .collect();
        let sep = format!(",{}{}", "\n".repeat(rank - dim - 1), " ".repeat(indent + 1));
        format!("[{}]", slices.join(&sep))
    }

    fn vector_str(&self, base: usize, indent: usize) -> String {
        let dim = self.shape.len() - 1;
        let element_length = self.fmt.max_width + 2;
        let per_line = ((LINE_WIDTH.saturating_sub(indent)) / element_length).max(1);
        let data: Vec<String> = kept(self.shape[dim], self.summarize)
            .into_iter()
            .map(|i| match i {
                Some(i) => self.fmt.format(self.values[base + i * self.strides[dim]]),
                None => " ...".to_string(),
            })
            .collect();
        let lines: Vec<String> = data.chunks(per_line).map(|c| c.join(", ")).collect();
        format!(
            "[{}]",
            lines.join(&format!(",\n{}", " ".repeat(indent + 1)))
        )
    }
}

/// Renders `t` as PyTorch would print it.
pub(crate) fn render(t: &Tensor) -> Result<String> {
    let shape = t.shape();
    let vals = values(t)?;
    let strides = crate::shape::contiguous_strides(shape).to_vec();
    let summarize = t.numel() > THRESHOLD;
    let float = t.dtype().is_float();
    let prefix = "tensor(";
    let indent = prefix.len();
    let mut suffixes = Vec::new();
    let body = if t.numel() == 0 {
        if shape.len() != 1 {
            suffixes.push(format!(
                "size=({}{})",
                join_display(shape, ", "),
                if shape.len() == 1 { "," } else { "" }
            ));
        }
        "[]".to_string()
    } else {
        let sample = Printer::summarized_values(shape, &strides, &vals, summarize);
        let p = Printer {
            shape,
            strides,
            values: &vals,
            summarize,
            fmt: Formatter::new(&sample, float),
        };
        p.tensor_str(0, 0, indent)
    };
    if !t.device().is_cpu() {
        suffixes.push(format!("device='{}'", t.device()));
    }
    if !matches!(t.dtype(), DType::F32 | DType::I64 | DType::Bool) {
        suffixes.push(format!("dtype={}", t.dtype()));
    }
    let mut out = format!("{prefix}{body}");
    let mut last_line_len = out.len() - out.rfind('\n').map_or(0, |i| i + 1) + 1;
    for s in suffixes {
        if last_line_len + s.len() + 2 > LINE_WIDTH {
            out.push_str(&format!(",\n{}{s}", " ".repeat(indent)));
            last_line_len = indent + s.len();
        } else {
            out.push_str(&format!(", {s}"));
            last_line_len += s.len() + 2;
        }
    }
    out.push(')');
    Ok(out)
}

impl fmt::Display for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match render(self) {
            Ok(s) => f.write_str(&s),
            Err(e) => write!(f, "tensor(<unreadable: {e}>)"),
        }
    }
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Tensor {{ shape: {:?}, strides: {:?}, offset: {}, dtype: {}, device: {}, data: {} }}",
            self.shape(),
            self.strides(),
            self.offset(),
            self.dtype(),
            self.device(),
            self
        )
    }
}

#[cfg(test)]
mod tests {
    use tpu_runtime::{DType, Device};

    use super::*;

    fn cpu() -> Device {
        Device::cpu()
    }

    // Expected strings are PyTorch 2.x's print() output for the same values.
    #[test]
    fn floats_like_pytorch() {
        // torch.tensor([[1., 2.], [3., 4.]])
        let t = Tensor::new([[1f32, 2.], [3., 4.]], &cpu()).unwrap();
        assert_eq!(t.to_string(), "tensor([[1., 2.],\n        [3., 4.]])");
        // torch.tensor([0.5, -1.25, 3.0])
        let t = Tensor::new([0.5f32, -1.25, 3.0], &cpu()).unwrap();
        assert_eq!(t.to_string(), "tensor([ 0.5000, -1.2500,  3.0000])");
        // torch.tensor([1e-5, 1.0])
        let t = Tensor::new([1e-5f32, 1.0], &cpu()).unwrap();
        assert_eq!(t.to_string(), "tensor([1.0000e-05, 1.0000e+00])");
        // torch.tensor([1., float('nan'), float('inf')])
        let t = Tensor::new([1f32, f32::NAN, f32::INFINITY], &cpu()).unwrap();
        assert_eq!(t.to_string(), "tensor([1., nan, inf])");
        // torch.tensor(3.5)
        assert_eq!(
            Tensor::scalar(3.5f32, &cpu()).unwrap().to_string(),
            "tensor(3.5000)"
        );
        // torch.tensor([1.5, 2.0], dtype=torch.bfloat16)
        let t = Tensor::new([1.5f32, 2.0], &cpu())
            .unwrap()
            .to_dtype(DType::BF16)
            .unwrap();
        assert_eq!(t.to_string(), "tensor([1.5000, 2.0000], dtype=bf16)");
    }

    #[test]
    fn ints_bools_empty() {
        // torch.arange(6).reshape(2, 3)
        let t = Tensor::arange(0, 6, 1, DType::I64, &cpu())
            .unwrap()
            .reshape([2, 3])
            .unwrap();
        assert_eq!(t.to_string(), "tensor([[0, 1, 2],\n        [3, 4, 5]])");
        // torch.tensor([-10, 5], dtype=torch.int32)
        let t = Tensor::new([-10i32, 5], &cpu()).unwrap();
        assert_eq!(t.to_string(), "tensor([-10,   5], dtype=i32)");
        // torch.tensor([True, False])
        let t = Tensor::new([true, false], &cpu()).unwrap();
        assert_eq!(t.to_string(), "tensor([ True, False])");
        // torch.zeros(0)
        assert_eq!(
            Tensor::zeros([0], DType::F32, &cpu()).unwrap().to_string(),
            "tensor([])"
        );
        // torch.zeros(2, 0)
        assert_eq!(
            Tensor::zeros([2, 0], DType::F32, &cpu())
                .unwrap()
                .to_string(),
            "tensor([], size=(2, 0))"
        );
    }

    #[test]
    fn large_tensors_are_summarised() {
        // torch.arange(2000)
        let t = Tensor::arange(0, 2000, 1, DType::I64, &cpu()).unwrap();
        assert_eq!(
            t.to_string(),
            "tensor([   0,    1,    2,  ..., 1997, 1998, 1999])"
        );
        // torch.arange(1000., 3000.).reshape(40, 50)
        let t = Tensor::arange(1000, 3000, 1, DType::F32, &cpu())
            .unwrap()
            .reshape([40, 50])
            .unwrap();
        let want = "tensor([[1000., 1001., 1002.,  ..., 1047., 1048., 1049.],\n        \
                    [1050., 1051., 1052.,  ..., 1097., 1098., 1099.],\n        \
                    [1100., 1101., 1102.,  ..., 1147., 1148., 1149.],\n        \
                    ...,\n        \
                    [2850., 2851., 2852.,  ..., 2897., 2898., 2899.],\n        \
                    [2900., 2901., 2902.,  ..., 2947., 2948., 2949.],\n        \
                    [2950., 2951., 2952.,  ..., 2997., 2998., 2999.]])";
        assert_eq!(t.to_string(), want);
    }

    #[test]
    fn long_rows_wrap() {
        // torch.arange(30.) / 7
        let v: Vec<f32> = (0..30).map(|i| i as f32 / 7.0).collect();
        let t = Tensor::from_vec(v, [30], &cpu()).unwrap();
        let s = t.to_string();
        let first = s.lines().next().unwrap();
        assert_eq!(
            first,
            "tensor([0.0000, 0.1429, 0.2857, 0.4286, 0.5714, 0.7143, 0.8571, 1.0000, 1.1429,"
        );
        assert!(s.lines().nth(1).unwrap().starts_with("        1.2857"));
    }

    #[test]
    fn debug_adds_layout() {
        let t = Tensor::new([[1f32, 2.], [3., 4.]], &cpu())
            .unwrap()
            .t()
            .unwrap();
        let d = format!("{t:?}");
        assert!(
            d.contains("shape: [2, 2], strides: [1, 2], offset: 0, dtype: f32, device: cpu"),
            "{d}"
        );
        assert!(d.contains("tensor([[1., 3.],"), "{d}");
    }
}
