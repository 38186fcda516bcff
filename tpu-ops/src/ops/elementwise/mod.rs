//! Elementwise ops: unary maps, binary arithmetic with broadcasting and type promotion, and
//! their methods on `Tensor`.

pub mod binary;
pub mod fused;
pub mod methods;
pub mod unary;
