//! A watch on a kind that only some clusters serve (a peer's CRD: Koordinator `Device`,
//! Volcano and KAI `PodGroup`): looked for at start (readiness then waits for the first
//! list), and every minute after until it appears.
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::StreamExt;
use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::reflector::{Store, store::Writer};
use kube::runtime::{WatchStreamExt, watcher};
use tracing::{debug, info};

/// How often the operator looks again for a kind that is not served.
const RECHECK: Duration = Duration::from_secs(60);

/// The watched objects of one optional kind (an empty store while it is not served).
#[derive(Clone)]
pub struct OptionalKind {
    store: Store<DynamicObject>,
    /// Whether the kind was served when the operator started (readiness waits for it).
    served_at_start: bool,
    /// Set once the watch holds a full list.
    listed: Arc<AtomicBool>,
}

impl OptionalKind {
    /// Looks for `gvk` (resource `plural`) and watches it when it is served, now or later;
    /// `changed` is called on every change. `what` names it in the logs; `without` says
    /// what the operator does while it is not served.
    pub async fn start(
        client: Client,
        gvk: GroupVersionKind,
        plural: &'static str,
        without: &'static str,
        changed: impl Fn() + Send + Sync + 'static,
    ) -> Self {
        let ar = ApiResource::from_gvk_with_plural(&gvk, plural);
        let writer: Writer<DynamicObject> = Writer::new(ar.clone());
        let store = writer.as_reader();
        let served_at_start = served(&client, &gvk).await;
        let listed = Arc::new(AtomicBool::new(false));
        let what = format!("{plural}.{}", gvk.group);
        {
            let (store, listed) = (store.clone(), listed.clone());
            tokio::spawn(async move {
                if store.wait_until_ready().await.is_ok() {
                    listed.store(true, Ordering::Release);
                }
            });
        }
        tokio::spawn(async move {
            if !served_at_start {
                info!(
                    "{what} not served: {without}; looking again every {}s",
                    RECHECK.as_secs()
                );
                while !served(&client, &gvk).await {
                    tokio::time::sleep(RECHECK).await;
                }
            }
            info!("watching {what}");
            let api = Api::<DynamicObject>::all_with(client, &ar);
            let mut stream = watcher(api, watcher::Config::default().any_semantic())
                .modify(|d: &mut DynamicObject| d.metadata.managed_fields = None)
                .default_backoff()
                .reflect(writer)
                .touched_objects()
                .boxed();
            while stream.next().await.is_some() {
                changed();
            }
        });
        OptionalKind {
            store,
            served_at_start,
            listed,
        }
    }

    /// Returns once the first list is in, when the kind was served at start; at once when
    /// it was not (nothing to wait for).
    pub async fn wait_until_ready(&self) {
        if self.served_at_start {
            let _ = self.store.wait_until_ready().await;
        }
    }

    /// Whether the watch holds a full list (the kind is served and listed).
    pub fn listed(&self) -> bool {
        self.listed.load(Ordering::Acquire)
    }

    /// The objects.
    pub fn state(&self) -> Vec<Arc<DynamicObject>> {
        self.store.state()
    }
}

/// Whether the API server serves `gvk` (any error: not now).
async fn served(client: &Client, gvk: &GroupVersionKind) -> bool {
    match kube::discovery::pinned_kind(client, gvk).await {
        Ok(_) => true,
        Err(e) => {
            debug!(error = %e, group = %gvk.group, kind = %gvk.kind, "kind not served");
            false
        }
    }
}
