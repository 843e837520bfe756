//! A watch on a kind that only some clusters serve (a peer's CRD: Koordinator `Device`,
//! Volcano and KAI `PodGroup`; DRA's `resource.k8s.io/v1` kinds, served from Kubernetes
//! 1.34; the `scheduling.k8s.io/v1beta1` `PodGroup`, served from 1.37 with the
//! `GenericWorkload` feature gate): looked for at start (readiness then waits for the
//! first list), and every minute after until it appears.
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::StreamExt;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::reflector::{Store, store::Writer};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource};
use tracing::{debug, info};

/// How often the operator looks again for a kind that is not served.
const RECHECK: Duration = Duration::from_secs(60);

/// The watched objects of one optional kind (an empty store while it is not served).
#[derive(Clone)]
pub struct OptionalKind {
    w: Watched<DynamicObject>,
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
        let api = Api::<DynamicObject>::all_with(client.clone(), &ar);
        let w = Watched::start(client, gvk, plural, api, writer, without, changed).await;
        OptionalKind { w }
    }

    /// An empty store that is never filled (a kind not watched: tests, tools).
    pub fn unwatched(gvk: &GroupVersionKind, plural: &'static str) -> Self {
        let ar = ApiResource::from_gvk_with_plural(gvk, plural);
        OptionalKind {
            w: Watched::unwatched(Writer::new(ar)),
        }
    }

    /// Returns once the first list is in, when the kind was served at start; at once when
    /// it was not (nothing to wait for).
    pub async fn wait_until_ready(&self) {
        self.w.wait_until_ready().await;
    }

    /// Whether the watch holds a full list (the kind is served and listed).
    pub fn listed(&self) -> bool {
        self.w.listed()
    }

    /// The objects.
    pub fn state(&self) -> Vec<Arc<DynamicObject>> {
        self.w.store.state()
    }
}

/// The watched objects of one optional built-in kind (a `k8s_openapi` type, e.g. DRA's
/// `resource.k8s.io/v1` kinds, served from Kubernetes 1.34): an empty store while the
/// API server does not serve it.
#[derive(Clone)]
pub struct OptionalTyped<K>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    w: Watched<K>,
}

impl<K> OptionalTyped<K>
where
    K: Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    /// Looks for the kind (resource `plural`) and watches it when it is served, now or
    /// later; `changed` is called on every change.
    pub async fn start(
        client: Client,
        plural: &'static str,
        without: &'static str,
        changed: impl Fn() + Send + Sync + 'static,
    ) -> Self {
        let gvk = GroupVersionKind::gvk(&K::group(&()), &K::version(&()), &K::kind(&()));
        let api = Api::<K>::all(client.clone());
        let w = Watched::start(
            client,
            gvk,
            plural,
            api,
            Writer::default(),
            without,
            changed,
        )
        .await;
        OptionalTyped { w }
    }

    /// An empty store that is never filled (a kind not watched: tests, tools).
    pub fn unwatched() -> Self {
        OptionalTyped {
            w: Watched::unwatched(Writer::default()),
        }
    }

    /// Returns once the first list is in, when the kind was served at start.
    pub async fn wait_until_ready(&self) {
        self.w.wait_until_ready().await;
    }

    /// Whether the watch holds a full list.
    pub fn listed(&self) -> bool {
        self.w.listed()
    }

    /// The objects.
    pub fn state(&self) -> Vec<Arc<K>> {
        self.w.store.state()
    }
}

/// One optional kind's store and the task that fills it once the kind is served.
#[derive(Clone)]
struct Watched<K>
where
    K: Resource + Clone + 'static,
    K::DynamicType: std::hash::Hash + Eq + Clone,
{
    store: Store<K>,
    /// Whether the kind was served when the operator started (readiness waits for it).
    served_at_start: bool,
    /// Set once the watch holds a full list.
    listed: Arc<AtomicBool>,
}

impl<K> Watched<K>
where
    K: Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + Sync + 'static,
    K::DynamicType: std::hash::Hash + Eq + Clone + Send + Sync,
{
    /// A store no watch fills.
    fn unwatched(writer: Writer<K>) -> Self {
        Watched {
            store: writer.as_reader(),
            served_at_start: false,
            listed: Arc::new(AtomicBool::new(false)),
        }
    }

    async fn start(
        client: Client,
        gvk: GroupVersionKind,
        plural: &'static str,
        api: Api<K>,
        writer: Writer<K>,
        without: &'static str,
        changed: impl Fn() + Send + Sync + 'static,
    ) -> Self {
        let store = writer.as_reader();
        let served_at_start = served(&client, &gvk).await;
        let listed = Arc::new(AtomicBool::new(false));
        let what = format!("{plural}.{}", gvk.group);
        let listed_w = listed.clone();
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
            let mut stream = watcher(api, watcher::Config::default().any_semantic())
                .modify(|o: &mut K| o.meta_mut().managed_fields = None)
                .default_backoff()
                .reflect(writer)
                .boxed();
            while let Some(event) = stream.next().await {
                // Listed once the first full list is in. Read from the stream itself: a
                // second task awaiting the store's readiness beside the operator's own
                // readiness wait is never woken (the store wakes one waiter).
                if matches!(event, Ok(watcher::Event::InitDone)) {
                    listed_w.store(true, Ordering::Release);
                }
                if !matches!(event, Ok(watcher::Event::Init)) {
                    changed();
                }
            }
        });
        Watched {
            store,
            served_at_start,
            listed,
        }
    }

    async fn wait_until_ready(&self) {
        if self.served_at_start {
            let _ = self.store.wait_until_ready().await;
        }
    }

    fn listed(&self) -> bool {
        self.listed.load(Ordering::Acquire)
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
