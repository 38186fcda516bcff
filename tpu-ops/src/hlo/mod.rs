//! Emitting StableHLO as MLIR text.
//!
//! Every op's lowering writes instructions into a [`FnBuilder`]; the eager PJRT path wraps one
//! op in a module, and the graph layer strings many ops' lowerings into one function. All
//! instructions use MLIR's generic form (`"stablehlo.add"(%a, %b) : (...) -> ...`), which every
//! StableHLO parser accepts and which needs no per-op pretty syntax.

pub mod checks;
pub mod lower;
pub mod view;

use std::fmt::{self, Write as _};

use tpu_tensor::tpu_runtime::pjrt::signature::mlir_element_type;
use tpu_tensor::{DType, Dims, Scalar, bf16, f16};

/// A ranked tensor type: static dims and an element type.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TensorType {
    /// Dimensions.
    pub dims: Dims,
    /// Element type (of each part, for a complex type).
    pub dtype: DType,
    /// True for `complex<dtype>` elements. Tensors hold no complex dtype; the FFT lowerings
    /// pass complex values between their own instructions only.
    pub complex: bool,
}

impl TensorType {
    /// A tensor type.
    pub fn new(dims: &[usize], dtype: DType) -> TensorType {
        TensorType {
            dims: dims.into(),
            dtype,
            complex: false,
        }
    }

    /// A tensor type of `complex<dtype>` elements (`dtype` f32 or f64).
    pub fn complex(dims: &[usize], dtype: DType) -> TensorType {
        TensorType {
            dims: dims.into(),
            dtype,
            complex: true,
        }
    }

    /// A rank-0 type.
    pub fn scalar(dtype: DType) -> TensorType {
        TensorType::new(&[], dtype)
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.dims.iter().product()
    }

    /// Rank.
    pub fn rank(&self) -> usize {
        self.dims.len()
    }

    /// Other dims with the same element type (complex ones stay complex).
    pub fn with_dims(&self, dims: &[usize]) -> TensorType {
        TensorType {
            dims: dims.into(),
            dtype: self.dtype,
            complex: self.complex,
        }
    }

    /// The same dims with another element type.
    pub fn with_dtype(&self, dtype: DType) -> TensorType {
        TensorType {
            dims: self.dims.clone(),
            dtype,
            complex: false,
        }
    }
}

impl fmt::Display for TensorType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("tensor<")?;
        for d in &self.dims {
            write!(f, "{d}x")?;
        }
        let element = mlir_element_type(self.dtype);
        if self.complex {
            write!(f, "complex<{element}>>")
        } else {
            write!(f, "{element}>")
        }
    }
}

/// An SSA value in a function being built.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Value {
    /// The SSA name, such as `%7`.
    pub name: String,
    /// Its type.
    pub ty: TensorType,
}

impl Value {
    /// Dims of the value.
    pub fn dims(&self) -> &[usize] {
        &self.ty.dims
    }

    /// Element type of the value.
    pub fn dtype(&self) -> DType {
        self.ty.dtype
    }
}

/// Comparison directions of `stablehlo.compare`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cmp {
    /// `==`
    Eq,
    /// `!=`
    Ne,
    /// `<`
    Lt,
    /// `<=`
    Le,
    /// `>`
    Gt,
    /// `>=`
    Ge,
}

impl Cmp {
    fn as_str(self) -> &'static str {
        match self {
            Cmp::Eq => "EQ",
            Cmp::Ne => "NE",
            Cmp::Lt => "LT",
            Cmp::Le => "LE",
            Cmp::Gt => "GT",
            Cmp::Ge => "GE",
        }
    }
}

/// Precision of matrix products on accelerators (TPUs multiply f32 in bf16 passes by default).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Precision {
    /// The platform's fastest (on TPU: one bf16 pass).
    #[default]
    Default,
    /// More passes (on TPU: three bf16 passes).
    High,
    /// Full f32 precision.
    Highest,
}

impl Precision {
    /// The StableHLO attribute value.
    pub fn as_attr(self) -> &'static str {
        match self {
            Precision::Default => "#stablehlo<precision DEFAULT>",
            Precision::High => "#stablehlo<precision HIGH>",
            Precision::Highest => "#stablehlo<precision HIGHEST>",
        }
    }
}

/// Formats an `array<i64: ...>` attribute.
pub fn i64_array(values: &[i64]) -> String {
    if values.is_empty() {
        return "array<i64>".to_string();
    }
    let parts: Vec<String> = values.iter().map(|v| v.to_string()).collect();
    format!("array<i64: {}>", parts.join(", "))
}

/// Formats a `[a, b]` list.
pub fn list(values: &[i64]) -> String {
    let parts: Vec<String> = values.iter().map(|v| v.to_string()).collect();
    format!("[{}]", parts.join(", "))
}

/// The smallest value of `dtype` (minus infinity for floats, false for bool): the start of a
/// max. Integer bounds are given per dtype, because `i64::MIN` would wrap to 0 in a narrower
/// integer literal.
pub fn lowest(dtype: DType) -> Scalar {
    match dtype {
        DType::Bool | DType::U8 => Scalar::Int(0),
        DType::I8 => Scalar::Int(i8::MIN.into()),
        DType::I32 => Scalar::Int(i32::MIN.into()),
        DType::I64 => Scalar::Int(i64::MIN),
        _ => Scalar::Float(f64::NEG_INFINITY),
    }
}

/// The largest value of `dtype` (infinity for floats, true for bool): the start of a min.
pub fn highest(dtype: DType) -> Scalar {
    match dtype {
        DType::Bool => Scalar::Int(1),
        DType::U8 => Scalar::Int(u8::MAX.into()),
        DType::I8 => Scalar::Int(i8::MAX.into()),
        DType::I32 => Scalar::Int(i32::MAX.into()),
        DType::I64 => Scalar::Int(i64::MAX),
        _ => Scalar::Float(f64::INFINITY),
    }
}

/// A scalar as an MLIR dense literal of `dtype`: floats as exact bit patterns in hex.
pub fn literal(dtype: DType, value: Scalar) -> String {
    match dtype {
        DType::Bool => if value.to_f64() != 0.0 {
            "true"
        } else {
            "false"
        }
        .to_string(),
        DType::U8 | DType::I8 | DType::I32 | DType::I64 => match dtype {
            DType::U8 => value.to_element::<u8>().to_string(),
            DType::I8 => value.to_element::<i8>().to_string(),
            DType::I32 => value.to_element::<i32>().to_string(),
            _ => value.to_element::<i64>().to_string(),
        },
        DType::F16 => format!("0x{:04X}", value.to_element::<f16>().to_bits()),
        DType::BF16 => format!("0x{:04X}", value.to_element::<bf16>().to_bits()),
        DType::F32 => format!("0x{:08X}", value.to_element::<f32>().to_bits()),
        DType::F64 => format!("0x{:016X}", value.to_element::<f64>().to_bits()),
    }
}

/// Builds the body of one function.
#[derive(Debug, Default)]
pub struct FnBuilder {
    args: Vec<Value>,
    /// Per parameter, the attributes printed after its type (empty for none).
    arg_attrs: Vec<String>,
    body: String,
    next: usize,
    indent: usize,
}

impl FnBuilder {
    /// An empty function.
    pub fn new() -> FnBuilder {
        FnBuilder {
            indent: 4,
            ..FnBuilder::default()
        }
    }

    fn fresh(&mut self) -> String {
        let n = format!("%v{}", self.next);
        self.next += 1;
        n
    }

    /// Adds a parameter.
    pub fn arg(&mut self, ty: TensorType) -> Value {
        let v = Value {
            name: format!("%arg{}", self.args.len()),
            ty,
        };
        self.args.push(v.clone());
        self.arg_attrs.push(String::new());
        v
    }

    /// Declares that parameter `arg`'s buffer may be reused for result `result` (same type):
    /// the caller donates it, and the device writes the result in place.
    pub fn alias_output(&mut self, arg: usize, result: usize) {
        if let Some(a) = self.arg_attrs.get_mut(arg) {
            *a = format!("tf.aliasing_output = {result} : i32");
        }
    }

    /// The parameters so far.
    pub fn args(&self) -> &[Value] {
        &self.args
    }

    fn line(&mut self, text: &str) {
        for _ in 0..self.indent {
            self.body.push(' ');
        }
        self.body.push_str(text);
        self.body.push('\n');
    }

    fn signature(operands: &[&Value], results: &[TensorType]) -> String {
        let ins: Vec<String> = operands.iter().map(|v| v.ty.to_string()).collect();
        let outs: Vec<String> = results.iter().map(|t| t.to_string()).collect();
        let out = if outs.len() == 1 {
            outs[0].clone()
        } else {
            format!("({})", outs.join(", "))
        };
        format!("({}) -> {out}", ins.join(", "))
    }

    /// Emits a generic instruction with several results. `attrs` is the text inside `{...}`
    /// (empty for none); `region` is a region's text without the outer parentheses (empty for
    /// none).
    pub fn op_n(
        &mut self,
        name: &str,
        operands: &[&Value],
        attrs: &str,
        region: &str,
        results: &[TensorType],
    ) -> Vec<Value> {
        let outs: Vec<Value> = results
            .iter()
            .map(|t| Value {
                name: self.fresh(),
                ty: t.clone(),
            })
            .collect();
        let mut text = String::new();
        if !outs.is_empty() {
            let names: Vec<&str> = outs.iter().map(|v| v.name.as_str()).collect();
            let _ = write!(text, "{} = ", names.join(", "));
        }
        let ops: Vec<&str> = operands.iter().map(|v| v.name.as_str()).collect();
        let _ = write!(text, "\"{name}\"({})", ops.join(", "));
        if !region.is_empty() {
            let _ = write!(text, " ({region})");
        }
        if !attrs.is_empty() {
            let _ = write!(text, " {{{attrs}}}");
        }
        let _ = write!(text, " : {}", FnBuilder::signature(operands, results));
        self.line(&text);
        outs
    }

    /// Emits a generic instruction with one result.
    pub fn op(
        &mut self,
        name: &str,
        operands: &[&Value],
        attrs: &str,
        result: TensorType,
    ) -> Value {
        self.op_n(name, operands, attrs, "", &[result]).remove(0)
    }

    /// An elementwise instruction whose result has the first operand's type.
    pub fn ew(&mut self, name: &str, operands: &[&Value]) -> Value {
        let ty = operands[0].ty.clone();
        self.op(name, operands, "", ty)
    }

    /// A constant splat of `value` with type `ty`.
    pub fn splat(&mut self, ty: TensorType, value: impl Into<Scalar>) -> Value {
        let attrs = format!("value = dense<{}> : {ty}", literal(ty.dtype, value.into()));
        self.op("stablehlo.constant", &[], &attrs, ty)
    }

    /// A rank-0 constant.
    pub fn scalar(&mut self, dtype: DType, value: impl Into<Scalar>) -> Value {
        self.splat(TensorType::scalar(dtype), value)
    }

    /// A constant with the given values (row-major).
    pub fn constant_i64(&mut self, dims: &[usize], values: &[i64]) -> Value {
        let ty = TensorType::new(dims, DType::I64);
        let parts: Vec<String> = values.iter().map(|v| v.to_string()).collect();
        let attrs = format!("value = dense<[{}]> : {ty}", parts.join(", "));
        let flat = TensorType::new(&[values.len()], DType::I64);
        let attrs = if dims.len() == 1 {
            attrs
        } else {
            format!("value = dense<[{}]> : {flat}", parts.join(", "))
        };
        if dims.len() == 1 {
            self.op("stablehlo.constant", &[], &attrs, ty)
        } else {
            let v = self.op("stablehlo.constant", &[], &attrs, flat);
            self.reshape(&v, dims)
        }
    }

    /// Converts to another element type (`stablehlo.convert`); returns `v` itself when equal.
    pub fn convert(&mut self, v: &Value, dtype: DType) -> Value {
        if v.dtype() == dtype {
            return v.clone();
        }
        if dtype == DType::Bool {
            // convert to i1 is a truncation in XLA; PyTorch's rule is "non-zero is true".
            let zero = self.splat(v.ty.clone(), 0);
            return self.compare(Cmp::Ne, v, &zero);
        }
        if v.dtype() == DType::Bool && dtype.is_float() {
            // XLA folds float ops over converted predicates in ways that lose IEEE results
            // (0/0 gave 0); a select keeps the values opaque to that rewrite.
            let one = self.splat(v.ty.with_dtype(dtype), 1);
            let zero = self.splat(v.ty.with_dtype(dtype), 0);
            return self.select(v, &one, &zero);
        }
        self.op("stablehlo.convert", &[v], "", v.ty.with_dtype(dtype))
    }

    /// Reshapes (same element count).
    pub fn reshape(&mut self, v: &Value, dims: &[usize]) -> Value {
        if v.dims() == dims {
            return v.clone();
        }
        self.op("stablehlo.reshape", &[v], "", v.ty.with_dims(dims))
    }

    /// Broadcasts `v` into `dims`; operand dim `i` becomes result dim `map[i]`.
    pub fn broadcast_in_dim(&mut self, v: &Value, map: &[i64], dims: &[usize]) -> Value {
        if v.dims() == dims && map.iter().enumerate().all(|(i, &m)| m == i as i64) {
            return v.clone();
        }
        let attrs = format!("broadcast_dimensions = {}", i64_array(map));
        self.op(
            "stablehlo.broadcast_in_dim",
            &[v],
            &attrs,
            v.ty.with_dims(dims),
        )
    }

    /// NumPy-style broadcast of `v` to `dims` (aligned right).
    pub fn broadcast_to(&mut self, v: &Value, dims: &[usize]) -> Value {
        let lead = dims.len() - v.ty.rank();
        let map: Vec<i64> = (0..v.ty.rank()).map(|i| (i + lead) as i64).collect();
        self.broadcast_in_dim(v, &map, dims)
    }

    /// Permutes dims: result dim `i` is operand dim `perm[i]`.
    pub fn transpose(&mut self, v: &Value, perm: &[i64]) -> Value {
        if perm.iter().enumerate().all(|(i, &p)| p == i as i64) {
            return v.clone();
        }
        let dims: Vec<usize> = perm.iter().map(|&p| v.dims()[p as usize]).collect();
        let attrs = format!("permutation = {}", i64_array(perm));
        self.op("stablehlo.transpose", &[v], &attrs, v.ty.with_dims(&dims))
    }

    /// A strided slice.
    pub fn slice(&mut self, v: &Value, start: &[i64], limit: &[i64], strides: &[i64]) -> Value {
        let dims: Vec<usize> = (0..start.len())
            .map(|i| {
                let n = limit[i] - start[i];
                if n <= 0 {
                    0
                } else {
                    ((n + strides[i] - 1) / strides[i]) as usize
                }
            })
            .collect();
        let attrs = format!(
            "start_indices = {}, limit_indices = {}, strides = {}",
            i64_array(start),
            i64_array(limit),
            i64_array(strides)
        );
        self.op("stablehlo.slice", &[v], &attrs, v.ty.with_dims(&dims))
    }

    /// Concatenates along `dim`.
    pub fn concatenate(&mut self, vs: &[&Value], dim: usize) -> Value {
        let mut dims: Dims = vs[0].ty.dims.clone();
        dims[dim] = vs.iter().map(|v| v.dims()[dim]).sum();
        let attrs = format!("dimension = {dim} : i64");
        self.op(
            "stablehlo.concatenate",
            vs,
            &attrs,
            vs[0].ty.with_dims(&dims),
        )
    }

    /// `0, 1, 2, ...` along `dim` of a tensor of `dims`.
    pub fn iota(&mut self, dims: &[usize], dim: usize, dtype: DType) -> Value {
        let attrs = format!("iota_dimension = {dim} : i64");
        self.op("stablehlo.iota", &[], &attrs, TensorType::new(dims, dtype))
    }

    /// Elementwise comparison; the comparison type follows the operands' dtype.
    pub fn compare(&mut self, dir: Cmp, a: &Value, b: &Value) -> Value {
        let kind = match a.dtype() {
            d if d.is_float() => "FLOAT",
            DType::Bool | DType::U8 => "UNSIGNED",
            _ => "SIGNED",
        };
        let attrs = format!(
            "comparison_direction = #stablehlo<comparison_direction {}>, compare_type = #stablehlo<comparison_type {kind}>",
            dir.as_str()
        );
        self.op(
            "stablehlo.compare",
            &[a, b],
            &attrs,
            a.ty.with_dtype(DType::Bool),
        )
    }

    /// `pred ? on_true : on_false`, elementwise.
    pub fn select(&mut self, pred: &Value, on_true: &Value, on_false: &Value) -> Value {
        let ty = on_true.ty.clone();
        self.op("stablehlo.select", &[pred, on_true, on_false], "", ty)
    }

    /// Elementwise maximum (`max`) or minimum of two values of one type, NaN propagating from
    /// either operand as in PyTorch: XLA's `maximum` and `minimum` need not propagate it (the CPU
    /// plugin's return the first operand when the second is NaN). Bools take or / and.
    pub fn extreme(&mut self, a: &Value, b: &Value, max: bool) -> Value {
        if a.dtype() == DType::Bool {
            return self.ew(if max { "stablehlo.or" } else { "stablehlo.and" }, &[a, b]);
        }
        let name = if max {
            "stablehlo.maximum"
        } else {
            "stablehlo.minimum"
        };
        let r = self.ew(name, &[a, b]);
        if !a.dtype().is_float() {
            return r;
        }
        let b_nan = self.compare(Cmp::Ne, b, b);
        let r = self.select(&b_nan, b, &r);
        let a_nan = self.compare(Cmp::Ne, a, a);
        self.select(&a_nan, a, &r)
    }

    /// A general matrix product.
    #[allow(clippy::too_many_arguments)]
    pub fn dot_general(
        &mut self,
        a: &Value,
        b: &Value,
        batch: (&[i64], &[i64]),
        contract: (&[i64], &[i64]),
        result: TensorType,
        precision: Precision,
    ) -> Value {
        let mut nums = Vec::new();
        if !batch.0.is_empty() {
            nums.push(format!("lhs_batching_dimensions = {}", list(batch.0)));
            nums.push(format!("rhs_batching_dimensions = {}", list(batch.1)));
        }
        nums.push(format!("lhs_contracting_dimensions = {}", list(contract.0)));
        nums.push(format!("rhs_contracting_dimensions = {}", list(contract.1)));
        let attrs = format!(
            "dot_dimension_numbers = #stablehlo.dot<{}>, precision_config = [{p}, {p}]",
            nums.join(", "),
            p = precision.as_attr()
        );
        self.op("stablehlo.dot_general", &[a, b], &attrs, result)
    }

    /// Reduces `inputs` over `dims` with a body built by `body`, which receives the scalar
    /// block arguments (accumulators first, then the new elements) and returns the results.
    pub fn reduce(
        &mut self,
        inputs: &[&Value],
        inits: &[&Value],
        dims: &[usize],
        body: impl FnOnce(&mut FnBuilder, &[Value]) -> Vec<Value>,
    ) -> Vec<Value> {
        let keep: Vec<usize> = (0..inputs[0].ty.rank())
            .filter(|d| !dims.contains(d))
            .collect();
        let out_dims: Vec<usize> = keep.iter().map(|&d| inputs[0].dims()[d]).collect();
        let results: Vec<TensorType> = inputs
            .iter()
            .map(|v| TensorType::new(&out_dims, v.dtype()))
            .collect();
        let region = self.region(
            &inits.iter().map(|v| v.ty.clone()).collect::<Vec<_>>(),
            2,
            body,
        );
        let dims_i64: Vec<i64> = dims.iter().map(|&d| d as i64).collect();
        let attrs = format!("dimensions = {}", i64_array(&dims_i64));
        let mut operands: Vec<&Value> = inputs.to_vec();
        operands.extend_from_slice(inits);
        self.op_n("stablehlo.reduce", &operands, &attrs, &region, &results)
    }

    /// Builds a region whose block takes `copies` groups of scalars of the given element
    /// types; returns its text.
    pub fn region(
        &mut self,
        scalar_types: &[TensorType],
        copies: usize,
        body: impl FnOnce(&mut FnBuilder, &[Value]) -> Vec<Value>,
    ) -> String {
        let mut inner = FnBuilder {
            args: Vec::new(),
            arg_attrs: Vec::new(),
            body: String::new(),
            next: self.next,
            indent: self.indent + 2,
        };
        let mut params = Vec::new();
        for _ in 0..copies {
            for t in scalar_types {
                let v = Value {
                    name: inner.fresh(),
                    ty: TensorType::scalar(t.dtype),
                };
                params.push(v);
            }
        }
        let outs = body(&mut inner, &params);
        let names: Vec<&str> = outs.iter().map(|v| v.name.as_str()).collect();
        let tys: Vec<String> = outs.iter().map(|v| v.ty.to_string()).collect();
        inner.line(&format!(
            "\"stablehlo.return\"({}) : ({}) -> ()",
            names.join(", "),
            tys.join(", ")
        ));
        self.next = inner.next;
        let header: Vec<String> = params
            .iter()
            .map(|p| format!("{}: {}", p.name, p.ty))
            .collect();
        let pad = " ".repeat(self.indent);
        format!(
            "{{\n{pad}^bb0({}):\n{}{pad}}}",
            header.join(", "),
            inner.body
        )
    }

    /// Wraps the function in a module whose `@main` returns `outputs`.
    pub fn finish_module(self, module: &str, outputs: &[Value]) -> String {
        let params: Vec<String> = self
            .args
            .iter()
            .zip(&self.arg_attrs)
            .map(|(a, attr)| match attr.is_empty() {
                true => format!("{}: {}", a.name, a.ty),
                false => format!("{}: {} {{{attr}}}", a.name, a.ty),
            })
            .collect();
        let out_tys: Vec<String> = outputs.iter().map(|v| v.ty.to_string()).collect();
        let ret_ty = if out_tys.len() == 1 {
            out_tys[0].clone()
        } else {
            format!("({})", out_tys.join(", "))
        };
        let names: Vec<&str> = outputs.iter().map(|v| v.name.as_str()).collect();
        let module: String = module
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '_' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        format!(
            "module @{module} {{\n  func.func public @main({}) -> {ret_ty} {{\n{}    \"func.return\"({}) : ({}) -> ()\n  }}\n}}\n",
            params.join(", "),
            self.body,
            names.join(", "),
            out_tys.join(", ")
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn types_and_literals() {
        assert_eq!(
            TensorType::new(&[2, 3], DType::F32).to_string(),
            "tensor<2x3xf32>"
        );
        assert_eq!(TensorType::scalar(DType::Bool).to_string(), "tensor<i1>");
        assert_eq!(literal(DType::F32, Scalar::Float(1.0)), "0x3F800000");
        assert_eq!(literal(DType::BF16, Scalar::Float(-2.0)), "0xC000");
        assert_eq!(literal(DType::I64, Scalar::Int(-5)), "-5");
        assert_eq!(literal(DType::Bool, Scalar::Int(3)), "true");
    }

    #[test]
    fn builds_a_module() {
        let mut b = FnBuilder::new();
        let x = b.arg(TensorType::new(&[2, 3], DType::F32));
        let zero = b.scalar(DType::F32, 0.0);
        let s = b.reduce(&[&x], &[&zero], &[1], |b, a| {
            vec![b.ew("stablehlo.add", &[&a[0], &a[1]])]
        });
        let text = b.finish_module("t", &s);
        assert!(text.contains("\"stablehlo.reduce\"(%arg0, %v0)"), "{text}");
        assert!(text.contains("dimensions = array<i64: 1>"), "{text}");
        assert!(text.contains("-> tensor<2xf32>"), "{text}");
    }
}
