//! What recording a step produces for submission: the dispatches, the uniform parameters,
//! the outputs and extra readbacks, the host-sampled rows and the late inputs (see `submit`).

use std::sync::Arc;

use poot_core::DType;
use poot_runtime::{HostTensor, LateInput};

use crate::gpu::{Buffer, Pipeline};
use crate::sample::SampleParams;

pub(crate) struct Dispatch {
    pub pipeline: Arc<Pipeline>,
    pub bufs: Vec<Arc<Buffer>>,
    pub params: (u64, u64),
    pub groups: [u32; 3],
    /// The equation it computes (`usize::MAX`: none, the stall kernel).
    pub eq: usize,
}

/// A row of a `Sample` node that the host samples after readback.
pub(crate) struct HostRow {
    pub output: String,
    pub row: usize,
    /// Index into the step's extra readbacks.
    pub logits_at: u64,
    pub vocab: usize,
    pub params: SampleParams,
}

/// A named output: its buffer, bytes, dtype and shape.
pub(crate) type Output = (String, Arc<Buffer>, u64, (DType, Vec<usize>));

/// An input the host supplies while the step runs (see `poot_runtime::LateInput`): its
/// buffer is written after the dispatches before `at` were submitted.
pub(crate) struct LateSlot {
    pub name: String,
    pub slot: LateInput,
    pub buf: Arc<Buffer>,
    pub at: usize,
    pub dtype: DType,
    pub shape: Vec<usize>,
}

impl LateSlot {
    /// Elements the input holds.
    pub fn buf_len(&self) -> usize {
        self.shape.iter().product()
    }
}

/// A step's host inputs and its late ones.
pub(crate) type StepInputs<'a> = (&'a [(&'a str, HostTensor)], &'a [(&'a str, LateInput)]);

/// What a recorded step hands to submission.
pub(crate) struct Recorded {
    pub dispatches: Vec<Dispatch>,
    pub params: Vec<u8>,
    pub outputs: Vec<Output>,
    /// Extra readbacks (logits of host-sampled rows): (buffer, bytes).
    pub extra: Vec<(Arc<Buffer>, u64)>,
    pub host_rows: Vec<HostRow>,
    /// In recording order (so by `at`).
    pub late: Vec<LateSlot>,
}

/// A host tensor's little-endian bytes.
pub(crate) fn tensor_bytes(t: &HostTensor) -> Vec<u8> {
    match t {
        HostTensor::F32 { data, .. } => data.iter().flat_map(|x| x.to_le_bytes()).collect(),
        HostTensor::I32 { data, .. } => data.iter().flat_map(|x| x.to_le_bytes()).collect(),
    }
}
