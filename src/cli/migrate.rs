//! `flotilla migrate-storage`: rewrites every App and Tenant at the storage version, then drops
//! the older versions from the CRDs' `status.storedVersions`, so that a later release can stop
//! serving `v1alpha1`.
//!
//! Each object gets an empty merge patch: the apiserver reads it (converting it from the
//! version it was stored in), and since its encoding at the storage version differs from the
//! stored bytes, writes it back at the storage version. Objects already stored at that
//! version are left as they are (the write is a no-op). Nothing in the objects changes, so no
//! App starts a rollout.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject, ListParams, Patch, PatchParams};
use serde_json::json;
use std::time::Duration;

use crate::api::{App, STORAGE_VERSION, Tenant};

/// Objects listed per request.
const PAGE: u32 = 500;
/// Field manager of the (empty) rewrites.
const MANAGER: &str = "flotilla-migrate-storage";

#[derive(Debug, thiserror::Error)]
pub enum MigrateError {
    #[error("reading CRD {crd}: {source}")]
    ReadCrd {
        crd: String,
        #[source]
        source: kube::Error,
    },
    #[error(
        "CRD {crd} stores {stored:?}, not {STORAGE_VERSION}: apply this release's CRDs first (kubectl apply --server-side -f crds/flotilla.dev.yaml)"
    )]
    NotUpgraded { crd: String, stored: Option<String> },
    #[error("listing {crd}: {source}")]
    List {
        crd: String,
        #[source]
        source: kube::Error,
    },
    #[error("rewriting {crd} {object}: {source}")]
    Rewrite {
        crd: String,
        object: String,
        #[source]
        source: kube::Error,
    },
    #[error("setting status.storedVersions of CRD {crd}: {source}")]
    StoredVersions {
        crd: String,
        #[source]
        source: kube::Error,
    },
}

/// What the migration did to one CRD.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Migrated {
    pub crd: String,
    pub objects: usize,
    pub stored_before: Vec<String>,
}

/// Migrates Apps and Tenants, reporting progress through `progress`.
pub async fn migrate_storage(client: Client, mut progress: impl FnMut(String)) -> Result<Vec<Migrated>, MigrateError> {
    let mut done = Vec::new();
    for resource in [ApiResource::erase::<Tenant>(&()), ApiResource::erase::<App>(&())] {
        done.push(migrate_one(&client, &resource, &mut progress).await?);
    }
    Ok(done)
}

/// Rewrites one object; `false` when it no longer exists. Conflicts, throttling and server
/// errors are retried (5 tries, 0.2 s doubling).
async fn rewrite_one(api: &Api<DynamicObject>, name: &str, params: &PatchParams) -> Result<bool, kube::Error> {
    let mut wait = Duration::from_millis(200);
    for attempt in 1.. {
        match api.patch(name, params, &Patch::Merge(json!({}))).await {
            Ok(_) => return Ok(true),
            Err(kube::Error::Api(status)) if status.code == 404 => return Ok(false),
            Err(kube::Error::Api(status))
                if attempt < 5 && (status.code == 409 || status.code == 429 || status.code >= 500) =>
            {
                tokio::time::sleep(wait).await;
                wait *= 2;
            }
            Err(e) => return Err(e),
        }
    }
    Ok(false)
}

async fn migrate_one(
    client: &Client,
    resource: &ApiResource,
    progress: &mut impl FnMut(String),
) -> Result<Migrated, MigrateError> {
    let crd_name = format!("{}.{}", resource.plural, resource.group);
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crd = crds.get(&crd_name).await.map_err(|source| MigrateError::ReadCrd { crd: crd_name.clone(), source })?;
    let storage = crd.spec.versions.iter().find(|v| v.storage).map(|v| v.name.clone());
    if storage.as_deref() != Some(STORAGE_VERSION) {
        return Err(MigrateError::NotUpgraded { crd: crd_name, stored: storage });
    }
    let stored_before = crd.status.as_ref().and_then(|s| s.stored_versions.clone()).unwrap_or_default();

    let api: Api<DynamicObject> = Api::all_with(client.clone(), resource);
    let mut objects = 0;
    let rewrite = PatchParams { field_manager: Some(MANAGER.into()), ..PatchParams::default() };
    let mut params = ListParams::default().limit(PAGE);
    loop {
        let page =
            api.list_metadata(&params).await.map_err(|source| MigrateError::List { crd: crd_name.clone(), source })?;
        for item in &page.items {
            let (name, namespace) = (item.metadata.name.clone().unwrap_or_default(), item.metadata.namespace.clone());
            let scoped: Api<DynamicObject> = match &namespace {
                Some(ns) => Api::namespaced_with(client.clone(), ns, resource),
                None => Api::all_with(client.clone(), resource),
            };
            match rewrite_one(&scoped, &name, &rewrite).await {
                Ok(true) => objects += 1,
                // Deleted since the list: nothing left to rewrite.
                Ok(false) => {}
                Err(source) => {
                    let object = namespace.map_or(name.clone(), |ns| format!("{ns}/{name}"));
                    return Err(MigrateError::Rewrite { crd: crd_name, object, source });
                }
            }
        }
        progress(format!("{crd_name}: {objects} rewritten at {STORAGE_VERSION}"));
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => break,
        }
    }

    crds.patch_status(
        &crd_name,
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"storedVersions": [STORAGE_VERSION]}})),
    )
    .await
    .map_err(|source| MigrateError::StoredVersions { crd: crd_name.clone(), source })?;
    progress(format!("{crd_name}: status.storedVersions {stored_before:?} -> [{STORAGE_VERSION:?}]"));
    Ok(Migrated { crd: crd_name, objects, stored_before })
}
