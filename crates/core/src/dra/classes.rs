//! DeviceClasses: the kind of devices a class selects, read from its name or its CEL
//! selectors.
use k8s_openapi::api::resource::v1::DeviceClass;

use super::{DeviceKind, NVIDIA_GPU_CLASS, NVIDIA_MIG_CLASS};

/// The kind of devices a DeviceClass selects, and the drivers its selectors name: from
/// its name (NVIDIA's classes) or from its CEL selectors (`type == 'gpu'`,
/// `device.driver == '…'`). No CEL is evaluated: a class the model cannot read is Other.
pub(super) fn class_kind(c: &DeviceClass) -> (DeviceKind, Vec<String>) {
    let name = c.metadata.name.as_deref().unwrap_or_default();
    let exprs: Vec<&str> = c
        .spec
        .as_ref()
        .and_then(|s| s.selectors.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|s| s.cel.as_ref().map(|c| c.expression.as_str()))
        .collect();
    let mut drivers = Vec::new();
    for e in &exprs {
        let mut rest = *e;
        while let Some(i) = rest.find("device.driver") {
            rest = &rest[i + "device.driver".len()..];
            let t = rest.trim_start();
            if let Some(t) = t.strip_prefix("==") {
                let t = t.trim_start();
                if let Some(q) = t.chars().next().filter(|q| *q == '\'' || *q == '"')
                    && let Some(end) = t[1..].find(q)
                {
                    drivers.push(t[1..1 + end].to_string());
                }
            }
        }
    }
    let says = |v: &str| {
        exprs.iter().any(|e| {
            e.contains(".type")
                && (e.contains(&format!("'{v}'")) || e.contains(&format!("\"{v}\"")))
        })
    };
    let kind = if name == NVIDIA_GPU_CLASS || says("gpu") {
        DeviceKind::Gpu
    } else if name == NVIDIA_MIG_CLASS || says("mig") {
        DeviceKind::Mig
    } else if c
        .spec
        .as_ref()
        .and_then(|s| s.extended_resource_name.as_deref())
        .is_some_and(|r| r.ends_with("/gpu"))
    {
        DeviceKind::Gpu
    } else {
        DeviceKind::Other
    };
    (kind, drivers)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dra::{Inventory, NVIDIA_DRIVER};

    fn class(name: &str, cel: &str, ext: Option<&str>) -> DeviceClass {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": name},
            "spec": {"selectors": [{"cel": {"expression": cel}}], "extendedResourceName": ext}
        }))
        .unwrap()
    }

    #[test]
    fn classes_are_read_from_names_and_selectors() {
        let nv = class("gpu.nvidia.com", "true", Some("nvidia.com/gpu"));
        assert_eq!(class_kind(&nv).0, DeviceKind::Gpu);
        let mig = class("mig.nvidia.com", "true", None);
        assert_eq!(class_kind(&mig).0, DeviceKind::Mig);
        let acme = class(
            "a",
            "device.driver == 'gpu.acme.io' && device.attributes['gpu.acme.io'].type == 'gpu'",
            None,
        );
        assert_eq!(
            class_kind(&acme),
            (DeviceKind::Gpu, vec!["gpu.acme.io".into()])
        );
        let nic = class("nic", "device.driver == \"nic.io\"", None);
        assert_eq!(class_kind(&nic), (DeviceKind::Other, vec!["nic.io".into()]));
        // Unterminated or odd text: no driver, no panic.
        let odd = class("o", "device.driver == 'x", None);
        assert_eq!(class_kind(&odd).1, Vec::<String>::new());
        let odd = class("o", "device.driver", None);
        assert_eq!(class_kind(&odd).1, Vec::<String>::new());
        let inv = Inventory::build(&[], &[], &[&nv, &acme], &[]);
        assert!(inv.is_gpu_driver("gpu.acme.io") && inv.is_gpu_driver(NVIDIA_DRIVER));
        assert_eq!(inv.extended_kind("nvidia.com/gpu"), Some(DeviceKind::Gpu));
        assert_eq!(
            inv.extended_kind("deviceclass.resource.kubernetes.io/a"),
            Some(DeviceKind::Gpu)
        );
    }
}
