//! `flotilla shards`: which replica holds which shard, since when, and how much work each has.

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams, PartialObjectMeta};
use kube::{Client, ResourceExt};
use std::collections::BTreeMap;

use crate::api::App;
use crate::sharding::leases::{holder, shard_of_lease};
use crate::sharding::shard_of;

/// One row of the table.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct ShardRow {
    pub shard: u32,
    pub holder: Option<String>,
    pub since: Option<Timestamp>,
    pub namespaces: usize,
    pub apps: usize,
}

/// Builds the table from what was read. Pure.
pub fn shard_table(shards: u32, leases: &[Lease], namespaces: &[String], apps: &[(String, String)]) -> Vec<ShardRow> {
    let mut rows: BTreeMap<u32, ShardRow> =
        (0..shards).map(|s| (s, ShardRow { shard: s, ..ShardRow::default() })).collect();
    for l in leases {
        let Some(shard) = l.metadata.name.as_deref().and_then(shard_of_lease) else { continue };
        if let Some(row) = rows.get_mut(&shard) {
            row.holder = holder(l).map(str::to_string);
            row.since = l.spec.as_ref().and_then(|s| s.acquire_time.as_ref()).map(|t| t.0);
        }
    }
    for ns in namespaces {
        if let Some(row) = rows.get_mut(&shard_of(ns, shards)) {
            row.namespaces += 1;
        }
    }
    for (ns, _) in apps {
        if let Some(row) = rows.get_mut(&shard_of(ns, shards)) {
            row.apps += 1;
        }
    }
    rows.into_values().collect()
}

pub fn render(rows: &[ShardRow], now: Timestamp) -> String {
    let mut out = format!("{:<6} {:<32} {:>10} {:>11} {:>6}\n", "SHARD", "HOLDER", "HELD FOR", "NAMESPACES", "APPS");
    for r in rows {
        let held_for = r
            .since
            .map(|s| format!("{}s", now.as_second().saturating_sub(s.as_second())))
            .unwrap_or_else(|| "-".into());
        out.push_str(&format!(
            "{:<6} {:<32} {:>10} {:>11} {:>6}\n",
            r.shard,
            r.holder.as_deref().unwrap_or("<free>"),
            held_for,
            r.namespaces,
            r.apps
        ));
    }
    let mut per_holder: BTreeMap<&str, usize> = BTreeMap::new();
    for r in rows {
        *per_holder.entry(r.holder.as_deref().unwrap_or("<free>")).or_insert(0) += 1;
    }
    let summary: Vec<String> = per_holder.iter().map(|(h, n)| format!("{h}: {n}")).collect();
    out.push_str(&format!("shards per holder: {}\n", summary.join(", ")));
    out
}

/// Reads Leases, namespaces and Apps, and prints the table.
pub async fn print_shards(client: Client, operator_namespace: &str, shards: u32) -> Result<String, kube::Error> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), operator_namespace);
    let leases = leases.list(&ListParams::default().labels("flotilla.dev/lease=shard")).await?.items;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let namespaces: Vec<String> =
        namespaces.list_metadata(&ListParams::default()).await?.items.iter().map(|n| n.name_any()).collect();
    let apps: Api<App> = Api::all(client);
    let apps: Vec<(String, String)> = apps
        .list_metadata(&ListParams::default())
        .await?
        .items
        .iter()
        .map(|a: &PartialObjectMeta<App>| (a.namespace().unwrap_or_default(), a.name_any()))
        .collect();
    Ok(render(&shard_table(shards, &leases, &namespaces, &apps), Timestamp::now()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::coordination::v1::LeaseSpec;

    #[test]
    fn table_counts_namespaces_and_apps_per_shard() {
        let lease = Lease {
            metadata: kube::api::ObjectMeta { name: Some("flotilla-shard-0".into()), ..Default::default() },
            spec: Some(LeaseSpec { holder_identity: Some("replica-a".into()), ..Default::default() }),
        };
        let namespaces = vec!["team-a-prod".to_string(), "default".to_string()];
        let apps = vec![("team-a-prod".to_string(), "web".to_string()), ("team-a-prod".to_string(), "api".to_string())];
        let rows = shard_table(32, &[lease], &namespaces, &apps);
        assert_eq!(rows.len(), 32);
        assert_eq!(rows[0].holder.as_deref(), Some("replica-a"));
        assert_eq!((rows[0].namespaces, rows[0].apps), (1, 2), "team-a-prod hashes to shard 0");
        assert_eq!(rows[30].namespaces, 1, "default hashes to shard 30");
        let text = render(&rows, Timestamp::from_second(100).expect("ts"));
        assert!(text.contains("replica-a: 1") && text.contains("<free>: 31"), "{text}");
    }
}
