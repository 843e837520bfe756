//! Pure parsers for the allocation records of every GPU-sharing scheme gpu-defrag understands.
//!
//! Each parser takes the raw text of one annotation (or one already-decoded object) and returns
//! plain data or a [`FormatError`]. The inputs are written by schedulers and device plugins, but
//! pod annotations can also be edited by tenants, so every parser:
//!
//! * refuses values longer than [`MAX_RECORD_BYTES`] before looking at them;
//! * caps the number of devices ([`MAX_DEVICES_PER_NODE`]) and containers ([`MAX_CONTAINERS`]);
//! * uses checked arithmetic only and never panics;
//! * runs in time and memory linear in the input.
//!
//! Submodules, one per scheme:
//! * [`hami`]: HAMi node registers (JSON and legacy strings), Volcano vGPU node registers, and the
//!   HAMi/Volcano vGPU pod device lists;
//! * [`koord`]: Koordinator `device-allocated` annotations and `Device` objects;
//! * [`volcano`]: Volcano gpushare index lists;
//! * [`aliyun`]: Aliyun gpushare `ALIYUN_COM_GPU_MEM_*` annotations;
//! * [`kai`]: KAI `gpu-fraction`;
//! * [`mig`]: MIG mixed-strategy resource names;
//! * [`quantity`]: Kubernetes `resource.Quantity` strings;
//! * [`share`]: the normalisation of a device share to thousandths of a GPU.

pub mod aliyun;
mod common;
mod error;
pub mod hami;
pub mod kai;
pub mod keys;
pub mod koord;
pub mod mig;
pub mod quantity;
pub mod share;
pub mod volcano;

pub use aliyun::{AliyunAlloc, parse_aliyun};
pub use error::FormatError;
pub use hami::{
    HamiContainerDevice, HamiNodeDevice, parse_hami_node_register, parse_hami_pod_devices,
    parse_volcano_node_register,
};
pub use kai::parse_gpu_fraction;
pub use koord::{
    KoordDevice, KoordGpuAlloc, parse_koord_device_allocated, parse_koord_device_object,
};
pub use mig::{MigProfile, parse_mig_profile, parse_mig_resource};
pub use quantity::{quantity_to_bytes, quantity_to_count, quantity_to_milli};
pub use share::share_milli;
pub use volcano::parse_index_list;

/// Largest annotation value any parser accepts, in bytes (64 KiB). Longer values are refused
/// with [`FormatError::TooLarge`] without being parsed.
pub const MAX_RECORD_BYTES: usize = 64 * 1024;

/// Most devices one node record (or one container's device list) may hold. Device indices and
/// minor numbers must also be below this bound.
pub const MAX_DEVICES_PER_NODE: usize = 64;

/// Most container slots one pod record may hold.
pub const MAX_CONTAINERS: usize = 64;

/// Largest per-device memory accepted in MiB (1 PiB). Far beyond any real GPU, and small enough
/// that converting it to bytes (`× 2^20`) cannot overflow a `u64`.
pub const MAX_DEVICE_MEM_MIB: u64 = 1 << 30;

/// Largest per-device memory accepted in bytes (1 PiB), the byte form of [`MAX_DEVICE_MEM_MIB`].
pub const MAX_DEVICE_MEM_BYTES: u64 = 1 << 50;

/// Longest identifier (GPU UUID) or model name accepted, in bytes.
pub const MAX_TEXT_FIELD_BYTES: usize = 256;
