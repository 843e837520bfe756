//! Names of the annotations and fields the parsers read. Errors name the record with these.

/// HAMi node inventory (JSON since v2.8.0, a `:`-separated string before).
pub const HAMI_NODE_REGISTER: &str = "hami.io/node-nvidia-register";
/// HAMi pod allocation record (the durable one).
pub const HAMI_DEVICES_ALLOCATED: &str = "hami.io/vgpu-devices-allocated";
/// HAMi pod allocation record still being consumed by the device plugin.
pub const HAMI_DEVICES_TO_ALLOCATE: &str = "hami.io/vgpu-devices-to-allocate";
/// Volcano vGPU node inventory (6-field `:`-separated string).
pub const VOLCANO_NODE_VGPU_REGISTER: &str = "volcano.sh/node-vgpu-register";
/// Volcano vGPU pod allocation record (HAMi pod format).
pub const VOLCANO_VGPU_IDS_NEW: &str = "volcano.sh/vgpu-ids-new";
/// Volcano gpushare pod record: the device index list.
pub const VOLCANO_GPU_INDEX: &str = "volcano.sh/gpu-index";
/// Koordinator pod device allocation record (JSON).
pub const KOORD_DEVICE_ALLOCATED: &str = "scheduling.koordinator.sh/device-allocated";
/// Koordinator `Device` object (cluster-scoped, one per node).
pub const KOORD_DEVICE_OBJECT: &str = "Device";
/// Koordinator GPU compute resource (100 = one GPU).
pub const KOORD_GPU_CORE: &str = "koordinator.sh/gpu-core";
/// Koordinator GPU memory ratio resource (100 = all of one GPU's memory).
pub const KOORD_GPU_MEMORY_RATIO: &str = "koordinator.sh/gpu-memory-ratio";
/// Koordinator GPU memory resource (bytes, as a quantity).
pub const KOORD_GPU_MEMORY: &str = "koordinator.sh/gpu-memory";
/// Aliyun gpushare: the device index.
pub const ALIYUN_GPU_MEM_IDX: &str = "ALIYUN_COM_GPU_MEM_IDX";
/// Aliyun gpushare: the pod's memory request.
pub const ALIYUN_GPU_MEM_POD: &str = "ALIYUN_COM_GPU_MEM_POD";
/// Aliyun gpushare: the chosen device's total memory.
pub const ALIYUN_GPU_MEM_DEV: &str = "ALIYUN_COM_GPU_MEM_DEV";
/// KAI fractional GPU request.
pub const KAI_GPU_FRACTION: &str = "gpu-fraction";
/// Used in errors from the quantity functions, which do not know the field they were given.
pub const QUANTITY: &str = "quantity";
