//! DefragPolicies: the dynamic API, create, patch, delete, status polling, and reading
//! conditions and fields out of a status; maintenance windows open now.
use std::{sync::Mutex, time::Duration};

use anyhow::{Context, Result, anyhow};
use kube::{
    Api, Client,
    api::{
        ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
    },
};
use serde_json::{Value, json};

use crate::fixtures::wait_for;

use super::POLICY_LABEL;

/// Where DefragPolicies are served.
pub fn policy_resource() -> ApiResource {
    let gvk = GroupVersionKind::gvk("gpu-defrag.io", "v1alpha1", "DefragPolicy");
    ApiResource::from_gvk_with_plural(&gvk, "defragpolicies")
}

/// The (cluster-scoped) DefragPolicy API.
pub fn policies(client: &Client) -> Api<DynamicObject> {
    Api::all_with(client.clone(), &policy_resource())
}

/// Creates policy `name` labelled `e2e-test=<selector>`.
pub async fn create_policy(client: &Client, name: &str, selector: &str, spec: Value) -> Result<()> {
    let ar = policy_resource();
    let obj: DynamicObject = serde_json::from_value(json!({
        "apiVersion": ar.api_version, "kind": ar.kind,
        "metadata": {"name": name, "labels": {POLICY_LABEL: selector}},
        "spec": spec,
    }))?;
    policies(client)
        .create(&PostParams::default(), &obj)
        .await
        .with_context(|| format!("creating DefragPolicy {name}"))?;
    Ok(())
}

/// Merge-patches the spec of policy `name`.
pub async fn patch_policy(client: &Client, name: &str, spec: Value) -> Result<()> {
    policies(client)
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": spec})),
        )
        .await
        .with_context(|| format!("patching DefragPolicy {name}"))?;
    Ok(())
}

/// Deletes policy `name` (absent is fine).
pub async fn delete_policy(client: &Client, name: &str) -> Result<()> {
    match policies(client)
        .delete(name, &DeleteParams::default())
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(e).with_context(|| format!("deleting DefragPolicy {name}")),
    }
}

/// The status of policy `name` (`null` when it has none yet).
pub async fn policy_status(client: &Client, name: &str) -> Result<Value> {
    let p = policies(client)
        .get(name)
        .await
        .with_context(|| format!("reading DefragPolicy {name}"))?;
    Ok(p.data.get("status").cloned().unwrap_or(Value::Null))
}

/// Polls the status of `name` until `pred` holds; returns that status.
pub async fn wait_status(
    client: &Client,
    name: &str,
    what: &str,
    timeout: Duration,
    pred: impl Fn(&Value) -> bool,
) -> Result<Value> {
    let last = Mutex::new(Value::Null);
    let r = wait_for(what, timeout, || async {
        let st = policy_status(client, name).await?;
        let ok = pred(&st);
        *last.lock().map_err(|_| anyhow!("lock"))? = st.clone();
        Ok(ok.then_some(st))
    })
    .await;
    r.map_err(|e| {
        let last = last.lock().map(|v| v.clone()).unwrap_or_default();
        e.context(format!(
            "last status of {name}: {}",
            serde_json::to_string_pretty(&last).unwrap_or_default()
        ))
    })
}

/// The condition `type_` of a status.
pub fn condition<'a>(status: &'a Value, type_: &str) -> Option<&'a Value> {
    status
        .get("conditions")?
        .as_array()?
        .iter()
        .find(|c| c.get("type").and_then(Value::as_str) == Some(type_))
}

/// `(status, reason, message)` of condition `type_`.
pub fn condition_parts(status: &Value, type_: &str) -> Option<(String, String, String)> {
    let c = condition(status, type_)?;
    let s = |k: &str| c.get(k).and_then(Value::as_str).unwrap_or("").to_string();
    Some((s("status"), s("reason"), s("message")))
}

/// An i64 at a JSON pointer.
pub fn int_at(v: &Value, pointer: &str) -> Option<i64> {
    v.pointer(pointer).and_then(Value::as_i64)
}

/// An f64 at a JSON pointer.
pub fn float_at(v: &Value, pointer: &str) -> Option<f64> {
    v.pointer(pointer).and_then(Value::as_f64)
}

/// A string at a JSON pointer.
pub fn str_at<'a>(v: &'a Value, pointer: &str) -> Option<&'a str> {
    v.pointer(pointer).and_then(Value::as_str)
}

/// Strings of an array at a JSON pointer.
pub fn strings_at(v: &Value, pointer: &str) -> Vec<String> {
    v.pointer(pointer)
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// A window open now and for the next hour, re-opening every minute (as `make demo`).
pub fn open_window_every_minute() -> Value {
    json!({"schedule": "* * * * *", "duration": "1h", "timeZone": "UTC"})
}

/// A daily window that opened at the start of the current UTC minute and lasts 1h: open
/// now, with the same end for the whole hour (a run keeps its window across restarts).
pub fn open_window_this_minute() -> Value {
    use chrono::Timelike;
    let now = chrono::Utc::now();
    json!({
        "schedule": format!("{} {} * * *", now.minute(), now.hour()),
        "duration": "1h",
        "timeZone": "UTC",
    })
}
