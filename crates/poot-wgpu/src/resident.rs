//! Run outputs kept on the device: [`WgpuRuntime::run_resident`] runs a step like `run` but
//! returns each named output as a [`DeviceTensor`] (its device buffer, no readback),
//! [`WgpuRuntime::read`] copies one back to the host when asked, and
//! [`WgpuRuntime::run_resident_with`] takes kept tensors back as inputs of a later step.
//!
//! Invariants: a kept buffer is the step's own (activation buffers are pooled per step, so no
//! later step writes it) and lives as long as its `DeviceTensor`; a step that takes it as an
//! input binds that buffer directly (no readback, no upload) and never returns it to its pool,
//! so the step only reads it; a tensor is read or bound only by the runtime that made it
//! (another's is a typed `Kernel` error, never a cross-device copy); a bound tensor of another
//! dtype or shape than the graph input is `InputMismatch`;
//! the step's wait and every read are bounded by the caller's deadline and poison the runtime
//! on a timeout or a lost device, as `run` does.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use poot_core::{DType, Deadline};
use poot_runtime::{CompiledPlan, HostTensor, RuntimeError};

use crate::plan::WgpuPlan;
use crate::{submit, WgpuRuntime};

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

pub(crate) fn next_runtime_id() -> u64 {
    NEXT_ID.fetch_add(1, Ordering::Relaxed)
}

/// One output of a resident run, held in a device buffer.
#[derive(Debug, Clone)]
pub struct DeviceTensor {
    pub(crate) buf: Arc<crate::gpu::Buffer>,
    bytes: u64,
    pub(crate) dtype: DType,
    pub(crate) shape: Vec<usize>,
    owner: u64,
}

impl DeviceTensor {
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Bytes of its values (4 per element: f32 or i32).
    pub fn nbytes(&self) -> u64 {
        self.bytes
    }
}

impl WgpuRuntime {
    /// Runs `plan` like `Runtime::run` and keeps its named outputs on the device.
    pub fn run_resident(
        &self,
        plan: &dyn CompiledPlan,
        inputs: &[(&str, poot_runtime::HostTensor)],
        deadline: Deadline,
    ) -> Result<Vec<(String, DeviceTensor)>, RuntimeError> {
        self.run_resident_with(plan, inputs, &[], deadline)
    }

    /// Like [`WgpuRuntime::run_resident`], with some inputs given as tensors this runtime
    /// kept on the device: each is bound as the input's buffer, never copied.
    pub fn run_resident_with(
        &self,
        plan: &dyn CompiledPlan,
        inputs: &[(&str, poot_runtime::HostTensor)],
        device: &[(&str, DeviceTensor)],
        deadline: Deadline,
    ) -> Result<Vec<(String, DeviceTensor)>, RuntimeError> {
        if device.iter().any(|(_, t)| t.owner != self.id) {
            return Err(RuntimeError::Kernel {
                op: "run_resident",
                detail: "an input tensor was made by another wgpu runtime".into(),
            });
        }
        self.check()?;
        let plan =
            plan.as_any()
                .downcast_ref::<WgpuPlan>()
                .ok_or_else(|| RuntimeError::Kernel {
                    op: "run_resident",
                    detail: "plan was compiled by another backend".into(),
                })?;
        let kv = self.kv_lock();
        let step = submit::run_step(
            self,
            plan,
            (inputs, &[]),
            device,
            kv.as_ref(),
            self.bound(deadline),
            true,
        );
        let (_, kept) = self.settle(step)?;
        Ok(kept
            .into_iter()
            .map(|(name, buf, bytes, (dtype, shape))| {
                let t = DeviceTensor {
                    buf,
                    bytes,
                    dtype,
                    shape,
                    owner: self.id,
                };
                (name, t)
            })
            .collect())
    }

    /// Whether `t` was made by this runtime (so a run here can bind it as an input).
    pub fn owns(&self, t: &DeviceTensor) -> bool {
        t.owner == self.id
    }

    /// Copies `t` to the host.
    pub fn read(&self, t: &DeviceTensor, deadline: Deadline) -> Result<HostTensor, RuntimeError> {
        if t.owner != self.id {
            return Err(RuntimeError::Kernel {
                op: "read",
                detail: "the tensor was made by another wgpu runtime".into(),
            });
        }
        self.check()?;
        let out = (
            String::new(),
            t.buf.clone(),
            t.bytes,
            (t.dtype, t.shape.clone()),
        );
        let r = submit::read_back(self, out, self.bound(deadline));
        self.settle(r)
    }
}
