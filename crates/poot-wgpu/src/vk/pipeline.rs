//! WGSL to a Vulkan compute pipeline: naga parses and validates the kernel, writes SPIR-V,
//! and the descriptor set layout is derived from the bindings the entry point uses (as wgpu's
//! automatic layout is), so the executor binds the same buffers on both devices: its storage
//! buffers at bindings `0..n` and its parameters (a uniform) at `n`.
//!
//! Invariants: every index and buffer access is clamped in bounds (naga's `Restrict`: wgpu's
//! choice on devices without `robustBufferAccess2`; naga's read-zero policy has no atomics),
//! and workgroup memory is zeroed by the shader (WGSL's rule); a kernel naga refuses is a
//! typed `Kernel` error, never a driver failure.

use std::sync::Arc;

use ash::vk;
use naga::back::spv;
use naga::proc::{BoundsCheckPolicies, BoundsCheckPolicy};
use naga::valid::{Capabilities, ValidationFlags, Validator};
use poot_runtime::RuntimeError;

use super::{vk_err, Shared, VkGpu};

/// A kernel's group-0 bindings: (binding number, descriptor type), by binding number.
pub(crate) type Bindings = Vec<(u32, vk::DescriptorType)>;

/// A compute pipeline with its layouts.
pub(crate) struct VkPipeline {
    shared: Arc<Shared>,
    pub raw: vk::Pipeline,
    pub layout: vk::PipelineLayout,
    pub set_layout: vk::DescriptorSetLayout,
    /// The entry point's bindings in group 0, by binding number, with their types.
    pub bindings: Bindings,
}

impl std::fmt::Debug for VkPipeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VkPipeline")
            .field("bindings", &self.bindings.len())
            .finish()
    }
}

impl Drop for VkPipeline {
    fn drop(&mut self) {
        if self.shared.faulted() {
            return;
        }
        // SAFETY: every submission that bound the pipeline was waited for (else faulted).
        unsafe {
            let d = &self.shared.device;
            d.destroy_pipeline(self.raw, None);
            d.destroy_pipeline_layout(self.layout, None);
            d.destroy_descriptor_set_layout(self.set_layout, None);
        }
    }
}

fn refused(label: &str, detail: String) -> RuntimeError {
    RuntimeError::Kernel {
        op: "vulkan pipeline",
        detail: format!("{label}: {detail}"),
    }
}

/// SPIR-V of a WGSL compute kernel (entry point `main`), and its group-0 bindings.
pub(crate) fn spirv(label: &str, src: &str) -> Result<(Vec<u32>, Bindings), RuntimeError> {
    let module =
        naga::front::wgsl::parse_str(src).map_err(|e| refused(label, e.emit_to_string(src)))?;
    let info = Validator::new(ValidationFlags::all(), Capabilities::all())
        .validate(&module)
        .map_err(|e| refused(label, format!("{e:?}")))?;
    let entry = module
        .entry_points
        .iter()
        .position(|e| e.name == "main" && e.stage == naga::ShaderStage::Compute)
        .ok_or_else(|| refused(label, "no compute entry point `main`".into()))?;
    let used = info.get_entry_point(entry);
    let mut bindings = Vec::new();
    for (handle, var) in module.global_variables.iter() {
        let Some(rb) = &var.binding else { continue };
        if used[handle].is_empty() {
            continue;
        }
        if rb.group != 0 {
            return Err(refused(label, format!("binding in group {}", rb.group)));
        }
        let kind = match var.space {
            naga::AddressSpace::Storage { .. } => vk::DescriptorType::STORAGE_BUFFER,
            naga::AddressSpace::Uniform => vk::DescriptorType::UNIFORM_BUFFER,
            other => {
                return Err(refused(
                    label,
                    format!("unsupported binding space {other:?}"),
                ))
            }
        };
        bindings.push((rb.binding, kind));
    }
    bindings.sort_by_key(|b| b.0);
    let options = spv::Options {
        lang_version: (1, 3),
        bounds_check_policies: BoundsCheckPolicies {
            index: BoundsCheckPolicy::Restrict,
            buffer: BoundsCheckPolicy::Restrict,
            image_load: BoundsCheckPolicy::Restrict,
            binding_array: BoundsCheckPolicy::Unchecked,
        },
        zero_initialize_workgroup_memory: spv::ZeroInitializeWorkgroupMemoryMode::Polyfill,
        ..spv::Options::default()
    };
    let pipeline = spv::PipelineOptions {
        shader_stage: naga::ShaderStage::Compute,
        entry_point: "main".into(),
    };
    let words = spv::write_vec(&module, &info, &options, Some(&pipeline))
        .map_err(|e| refused(label, e.to_string()))?;
    Ok((words, bindings))
}

/// Builds the compute pipeline of `src` on `gpu`.
pub(crate) fn build(gpu: &VkGpu, label: &str, src: &str) -> Result<VkPipeline, RuntimeError> {
    let (words, bindings) = spirv(label, src)?;
    let shared = gpu.shared.clone();
    let d = &shared.device;
    let entries: Vec<_> = bindings
        .iter()
        .map(|&(b, kind)| {
            vk::DescriptorSetLayoutBinding::default()
                .binding(b)
                .descriptor_type(kind)
                .descriptor_count(1)
                .stage_flags(vk::ShaderStageFlags::COMPUTE)
        })
        .collect();
    // SAFETY: objects created on a live device from well-formed create infos; each failure
    // destroys what was created before it.
    unsafe {
        let set_layout = d
            .create_descriptor_set_layout(
                &vk::DescriptorSetLayoutCreateInfo::default().bindings(&entries),
                None,
            )
            .map_err(|e| vk_err("vkCreateDescriptorSetLayout", e))?;
        let sets = [set_layout];
        let layout = match d.create_pipeline_layout(
            &vk::PipelineLayoutCreateInfo::default().set_layouts(&sets),
            None,
        ) {
            Ok(l) => l,
            Err(e) => {
                d.destroy_descriptor_set_layout(set_layout, None);
                return Err(vk_err("vkCreatePipelineLayout", e));
            }
        };
        let module = match d
            .create_shader_module(&vk::ShaderModuleCreateInfo::default().code(&words), None)
        {
            Ok(m) => m,
            Err(e) => {
                d.destroy_pipeline_layout(layout, None);
                d.destroy_descriptor_set_layout(set_layout, None);
                return Err(vk_err("vkCreateShaderModule", e));
            }
        };
        let stage = vk::PipelineShaderStageCreateInfo::default()
            .stage(vk::ShaderStageFlags::COMPUTE)
            .module(module)
            .name(c"main");
        let info = vk::ComputePipelineCreateInfo::default()
            .stage(stage)
            .layout(layout);
        let made = d.create_compute_pipelines(vk::PipelineCache::null(), &[info], None);
        d.destroy_shader_module(module, None);
        match made {
            Ok(p) if p.len() == 1 => Ok(VkPipeline {
                shared: shared.clone(),
                raw: p[0],
                layout,
                set_layout,
                bindings,
            }),
            Ok(_) | Err(_) => {
                d.destroy_pipeline_layout(layout, None);
                d.destroy_descriptor_set_layout(set_layout, None);
                Err(refused(label, "vkCreateComputePipelines failed".into()))
            }
        }
    }
}
