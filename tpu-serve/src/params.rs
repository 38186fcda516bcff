//! Reading OpenAI request bodies field by field, so that every bad value comes back as an
//! error naming its parameter (serde's derived errors name a line and column instead).

use serde_json::{Map, Value};

use crate::error::ApiError;

/// A request body: a JSON object.
pub struct Body(pub Map<String, Value>);

impl Body {
    /// Parses `bytes` as a JSON object.
    pub fn parse(bytes: &[u8]) -> Result<Body, ApiError> {
        let v: Value = serde_json::from_slice(bytes)
            .map_err(|e| ApiError::bad(format!("the body is not valid JSON: {e}"), None))?;
        match v {
            Value::Object(m) => Ok(Body(m)),
            other => Err(ApiError::bad(
                format!("the body must be a JSON object, got {}", kind(&other)),
                None,
            )),
        }
    }

    /// The value of `name`, when present and not null.
    pub fn get(&self, name: &str) -> Option<&Value> {
        self.0.get(name).filter(|v| !v.is_null())
    }

    /// A required string.
    pub fn string(&self, name: &str) -> Result<String, ApiError> {
        match self.get(name) {
            Some(Value::String(s)) => Ok(s.clone()),
            Some(v) => Err(wrong(name, "a string", v)),
            None => Err(ApiError::bad(format!("'{name}' is required"), Some(name))),
        }
    }

    /// An optional number in `range` (inclusive), given as `want` in errors.
    pub fn number(
        &self,
        name: &str,
        range: std::ops::RangeInclusive<f64>,
        want: &str,
    ) -> Result<Option<f64>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some(v) => match v.as_f64() {
                Some(x) if range.contains(&x) => Ok(Some(x)),
                _ => Err(wrong(name, want, v)),
            },
        }
    }

    /// An optional whole number in `range`, given as `want` in errors.
    pub fn integer(
        &self,
        name: &str,
        range: std::ops::RangeInclusive<i64>,
        want: &str,
    ) -> Result<Option<i64>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some(v) => match v.as_i64() {
                Some(x) if range.contains(&x) => Ok(Some(x)),
                // A fraction, a string, or past i64.
                _ => Err(wrong(name, want, v)),
            },
        }
    }

    /// An optional boolean.
    pub fn boolean(&self, name: &str) -> Result<Option<bool>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(wrong(name, "a boolean", v)),
        }
    }

    /// An optional string or list of strings (as `stop` takes), at most `max` of them.
    pub fn strings(&self, name: &str, max: usize) -> Result<Vec<String>, ApiError> {
        let list = match self.get(name) {
            None => return Ok(Vec::new()),
            Some(Value::String(s)) => vec![s.clone()],
            Some(Value::Array(a)) => a
                .iter()
                .map(|v| match v {
                    Value::String(s) => Ok(s.clone()),
                    v => Err(wrong(name, "a string or a list of strings", v)),
                })
                .collect::<Result<_, _>>()?,
            Some(v) => return Err(wrong(name, "a string or a list of strings", v)),
        };
        if list.len() > max {
            return Err(ApiError::bad(
                format!(
                    "'{name}' has {} entries, at most {max} are allowed",
                    list.len()
                ),
                Some(name),
            ));
        }
        if list.iter().any(String::is_empty) {
            return Err(ApiError::bad(
                format!("'{name}' has an empty string"),
                Some(name),
            ));
        }
        Ok(list)
    }
}

/// The JSON kind of `v`, for messages.
pub fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

/// The error for parameter `name` holding `v` where `want` was expected.
pub fn wrong(name: &str, want: &str, v: &Value) -> ApiError {
    let shown = match v {
        Value::String(s) if s.len() > 40 => format!("a string of {} bytes", s.len()),
        Value::Array(_) | Value::Object(_) => kind(v).to_string(),
        v => v.to_string(),
    };
    ApiError::bad(format!("'{name}' must be {want}, got {shown}"), Some(name))
}
