//! The kinds of the general tensor ops (`Op::Unary`, `Op::Binary`, `Op::Scalar`,
//! `Op::Reduce`) and numpy's broadcasting rule, shared by the tracer and every runtime.
//!
//! Invariant: each kind's `name` is the `Op::name` of its op, the string `supports(op)` takes.

/// Elementwise functions of one f32 operand (`Op::Unary`), named as `Op::name` spells them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum UnaryKind {
    /// `max(x, 0)` (NaN stays NaN).
    Relu,
    /// Exact GELU, `0.5 * x * (1 + erf(x / sqrt 2))` (torch's default `nn.GELU()`).
    GeluErf,
    Tanh,
    /// `1 / (1 + exp(-x))`.
    Sigmoid,
    Neg,
    Exp,
    Sqrt,
    /// `1 / sqrt(x)`.
    Rsqrt,
    Abs,
    /// Natural log (NaN below 0, -inf at 0): cross-entropy's log-sum-exp.
    Log,
    /// Heaviside step `x > 0 ? 1 : 0` (0 at 0 and for NaN): relu's derivative.
    Step,
    /// The derivative of exact GELU, `Phi(x) + x * phi(x)` (the normal CDF and density).
    GeluErfGrad,
}

impl UnaryKind {
    pub const ALL: [UnaryKind; 12] = [
        UnaryKind::Relu,
        UnaryKind::GeluErf,
        UnaryKind::Tanh,
        UnaryKind::Sigmoid,
        UnaryKind::Neg,
        UnaryKind::Exp,
        UnaryKind::Sqrt,
        UnaryKind::Rsqrt,
        UnaryKind::Abs,
        UnaryKind::Log,
        UnaryKind::Step,
        UnaryKind::GeluErfGrad,
    ];

    pub fn name(self) -> &'static str {
        match self {
            UnaryKind::Relu => "relu",
            UnaryKind::GeluErf => "gelu_erf",
            UnaryKind::Tanh => "tanh",
            UnaryKind::Sigmoid => "sigmoid",
            UnaryKind::Neg => "neg",
            UnaryKind::Exp => "exp",
            UnaryKind::Sqrt => "sqrt",
            UnaryKind::Rsqrt => "rsqrt",
            UnaryKind::Abs => "abs",
            UnaryKind::Log => "log",
            UnaryKind::Step => "step",
            UnaryKind::GeluErfGrad => "gelu_erf_grad",
        }
    }
}

/// The arithmetic of `Op::Binary` (both operands broadcast) and `Op::Scalar` (`x op value`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BinaryKind {
    Add,
    Sub,
    Mul,
    Div,
}

impl BinaryKind {
    pub const ALL: [BinaryKind; 4] = [
        BinaryKind::Add,
        BinaryKind::Sub,
        BinaryKind::Mul,
        BinaryKind::Div,
    ];

    /// `a op b`, one f32 rounding (IEEE).
    #[inline]
    pub fn apply(self, a: f32, b: f32) -> f32 {
        match self {
            BinaryKind::Add => a + b,
            BinaryKind::Sub => a - b,
            BinaryKind::Mul => a * b,
            BinaryKind::Div => a / b,
        }
    }

    /// The name of `Op::Binary` of this kind.
    pub fn binary_name(self) -> &'static str {
        match self {
            BinaryKind::Add => "binary_add",
            BinaryKind::Sub => "binary_sub",
            BinaryKind::Mul => "binary_mul",
            BinaryKind::Div => "binary_div",
        }
    }

    /// The name of `Op::Scalar` of this kind.
    pub fn scalar_name(self) -> &'static str {
        match self {
            BinaryKind::Add => "scalar_add",
            BinaryKind::Sub => "scalar_sub",
            BinaryKind::Mul => "scalar_mul",
            BinaryKind::Div => "scalar_div",
        }
    }
}

/// What `Op::Reduce` computes over the last dim.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceKind {
    Sum,
    Mean,
    Max,
}

impl ReduceKind {
    pub const ALL: [ReduceKind; 3] = [ReduceKind::Sum, ReduceKind::Mean, ReduceKind::Max];

    pub fn name(self) -> &'static str {
        match self {
            ReduceKind::Sum => "reduce_sum",
            ReduceKind::Mean => "reduce_mean",
            ReduceKind::Max => "reduce_max",
        }
    }
}

/// The shape `a` and `b` broadcast to under numpy's rule (shapes aligned at the right; a dim
/// of 1 stretches), or `None` when they do not broadcast.
pub fn broadcast_shape(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    let n = a.len().max(b.len());
    let mut out = vec![0; n];
    for (i, o) in out.iter_mut().enumerate() {
        let da = if i + a.len() >= n {
            a[i + a.len() - n]
        } else {
            1
        };
        let db = if i + b.len() >= n {
            b[i + b.len() - n]
        } else {
            1
        };
        *o = match (da, db) {
            (x, y) if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            _ => return None,
        };
    }
    Some(out)
}
