//! Reading the parameter types of a StableHLO module's `main` function from its MLIR text.
//!
//! PJRT cannot tell a caller what an executable's parameters are, and some plugins abort the
//! process on a mismatched argument rather than returning an error. So tpu-rs reads the
//! signature from the program text it compiles and checks every call against it first.

use std::fmt;

use crate::dtype::DType;

/// One parameter: dtype and static dims.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParamType {
    /// Element type.
    pub dtype: DType,
    /// Dimensions.
    pub dims: Vec<usize>,
}

impl fmt::Display for ParamType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "tensor<")?;
        for d in &self.dims {
            write!(f, "{d}x")?;
        }
        write!(f, "{}>", mlir_element_type(self.dtype))
    }
}

/// The MLIR spelling of a dtype (`f32`, `bf16`, `i1` for bool, `ui8` for u8).
pub fn mlir_element_type(dtype: DType) -> &'static str {
    match dtype {
        DType::Bool => "i1",
        DType::U8 => "ui8",
        // The others are spelled as tpu-rs prints them.
        other => other.name(),
    }
}

fn parse_element(s: &str) -> Option<DType> {
    Some(match s {
        "i1" => DType::Bool,
        "ui8" => DType::U8,
        "i8" | "si8" => DType::I8,
        "i32" | "si32" => DType::I32,
        "i64" | "si64" => DType::I64,
        "f16" => DType::F16,
        "bf16" => DType::BF16,
        "f32" => DType::F32,
        "f64" => DType::F64,
        _ => return None,
    })
}

/// Parses `tensor<2x3xf32>` (or `tensor<f32>`).
pub fn parse_tensor_type(s: &str) -> Option<ParamType> {
    let inner = s.trim().strip_prefix("tensor<")?.strip_suffix('>')?;
    // An encoding such as `tensor<4xf32, #layout>` is not part of the shape.
    let inner = inner.split(',').next()?.trim();
    let mut parts: Vec<&str> = inner.split('x').collect();
    let elem = parts.pop()?;
    // `ui8`/`bf16` contain no 'x'; but a dim list never ends in a number, so the last part is
    // the element type.
    let dtype = parse_element(elem)?;
    let dims = parts
        .iter()
        .map(|p| p.parse::<usize>().ok())
        .collect::<Option<Vec<_>>>()?;
    Some(ParamType { dtype, dims })
}

/// The parameter types of `@main`, or `None` when the text has no recognisable `@main` with
/// static tensor parameters (the program is then passed through unchecked).
pub fn main_params(program: &str) -> Option<Vec<ParamType>> {
    let start = program.find("@main(")? + "@main(".len();
    let rest = &program[start..];
    // Find the matching close paren, splitting the argument list at top-level commas.
    let mut depth = 0i32;
    let mut args = Vec::new();
    let mut cur = String::new();
    let mut end = None;
    for (i, c) in rest.char_indices() {
        match c {
            '(' | '<' | '{' | '[' => depth += 1,
            ')' if depth == 0 => {
                end = Some(i);
                break;
            }
            ')' | '>' | '}' | ']' => depth -= 1,
            ',' if depth == 0 => {
                args.push(std::mem::take(&mut cur));
                continue;
            }
            _ => {}
        }
        cur.push(c);
    }
    end?;
    if !cur.trim().is_empty() {
        args.push(cur);
    }
    args.iter()
        .map(|a| {
            // `%name: tensor<...> {attrs} loc(...)`
            let (_, ty) = a.split_once(':')?;
            let ty = ty.trim();
            let close = ty.find('>')?;
            // Nested `<` inside a tensor type only appear in encodings; find the matching one.
            let mut depth = 0;
            let mut stop = close;
            for (i, c) in ty.char_indices() {
                match c {
                    '<' => depth += 1,
                    '>' => {
                        depth -= 1;
                        if depth == 0 {
                            stop = i;
                            break;
                        }
                    }
                    _ => {}
                }
            }
            parse_tensor_type(&ty[..=stop])
        })
        .collect()
}

/// The first lines of a program, for error messages.
pub fn program_head(program: &str, lines: usize) -> String {
    let mut out: Vec<&str> = program.lines().take(lines).collect();
    if program.lines().count() > lines {
        out.push("...");
    }
    out.join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_main_signature() {
        let p = "module @m {\n  func.func public @main(%a: tensor<2x3xf32>, %b: tensor<i64> {mhlo.sharding = \"{replicated}\"}, %c: tensor<0x4xbf16>, %d: tensor<4xui8>, %e: tensor<2xi1>) -> tensor<2x3xf32> {\n";
        let ps = main_params(p).unwrap();
        assert_eq!(ps.len(), 5);
        assert_eq!(
            ps[0],
            ParamType {
                dtype: DType::F32,
                dims: vec![2, 3]
            }
        );
        assert_eq!(
            ps[1],
            ParamType {
                dtype: DType::I64,
                dims: vec![]
            }
        );
        assert_eq!(ps[2].dims, vec![0, 4]);
        assert_eq!(ps[3].dtype, DType::U8);
        assert_eq!(ps[4].dtype, DType::Bool);
        assert_eq!(ps[0].to_string(), "tensor<2x3xf32>");
        assert_eq!(
            main_params("func.func @main() -> tensor<f32>").unwrap(),
            vec![]
        );
        assert!(main_params("func.func @main(%a: tensor<?xf32>)").is_none());
        assert!(main_params("no main here").is_none());
    }
}
