//! How many shards a replica may still take without outgrowing its memory. A replica's memory
//! grows with the Apps it serves: bench/replica_memory.sh measured 79-81 MiB of RSS at 3,333
//! Apps in 333 namespaces, 40-42 MiB with no App and about 12 KiB per App of the smallest kind
//! (docs/measurements.md). `PER_APP_BYTES` (64 KiB) is five times that: a cached App holds
//! its template and status a copy of the stable one (up to 64 KiB each), so an App near
//! that limit can cost twice the constant; the constants were not re-derived. When one of three
//! replicas dies, each survivor would take half of its load; with a limit sized for a third
//! of the Apps, that OOM-kills the survivors one after the other. With a budget, a replica
//! stops taking shards when the Apps it serves fill it, and leaves the rest unowned (counted
//! in `flotilla_shards_unowned`, alerted on) rather than dying. Pure.

/// Memory a replica uses serving no App (runtime, clients, metrics, Tenant cache), bytes.
pub const BASELINE_BYTES: u64 = 40 * 1024 * 1024;
/// RSS per served App, bytes (see the module documentation).
pub const PER_APP_BYTES: u64 = 64 * 1024;
/// Share of the container's memory limit the budget takes by default: the rest is headroom
/// for bursts (a relist, a burst of Events).
pub const SHARE_OF_LIMIT: f64 = 0.8;

/// The most Apps a replica may serve.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Budget {
    pub max_apps: usize,
}

impl Budget {
    /// The Apps that fit in `bytes`: what is left over the baseline, at `PER_APP_BYTES` each.
    pub fn from_bytes(bytes: u64) -> Self {
        let apps = bytes.saturating_sub(BASELINE_BYTES) / PER_APP_BYTES;
        Self { max_apps: usize::try_from(apps).unwrap_or(usize::MAX) }
    }

    /// Whether the Apps served fill the budget: no room left for a shard of the average
    /// weight of those held (announced to peers, who then share the rest without it).
    pub fn is_full(&self, apps: usize, held: usize) -> bool {
        let room = self.max_apps.saturating_sub(apps);
        room == 0 || (held > 0 && apps > 0 && room < apps.div_ceil(held))
    }

    /// How many more shards may be taken now, holding `held` shards that serve `apps` Apps.
    /// A shard is expected to weigh what the held ones weigh on average; while that is not
    /// known (no shard, or no App seen yet: caches may still be filling), one shard at a time.
    /// Zero once full.
    pub fn shards_allowed(&self, apps: usize, held: usize) -> usize {
        let room = self.max_apps.saturating_sub(apps);
        if room == 0 {
            return 0;
        }
        if held == 0 || apps == 0 {
            return 1;
        }
        room / apps.div_ceil(held)
    }
}

/// The container's memory limit in bytes, from the cgroup v2 `memory.max` file or the v1
/// `memory.limit_in_bytes` one (`None`: no limit, or not in a cgroup that has one).
pub fn cgroup_limit(v2_memory_max: Option<&str>, v1_limit_in_bytes: Option<&str>) -> Option<u64> {
    let parse = |s: &str| s.trim().parse::<u64>().ok();
    if let Some(v2) = v2_memory_max {
        return parse(v2);
    }
    // cgroup v1 reports "no limit" as a huge number (PAGE_COUNTER_MAX pages).
    v1_limit_in_bytes.and_then(parse).filter(|b| *b < (1u64 << 60))
}

/// The default budget: `SHARE_OF_LIMIT` of the container's memory limit, if it has one.
pub fn default_bytes(limit: Option<u64>) -> Option<u64> {
    limit.map(|l| (l as f64 * SHARE_OF_LIMIT) as u64)
}

/// Parses `--memory-budget`: bytes with an optional Kubernetes suffix (`Ki`, `Mi`, `Gi`,
/// `K`, `M`, `G`), or `unlimited` (`u64::MAX`: no budget, whatever the container's limit).
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let s = s.trim();
    if s.eq_ignore_ascii_case("unlimited") {
        return Ok(u64::MAX);
    }
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (number, suffix) = s.split_at(split);
    let unit: u64 = match suffix {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "K" | "k" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        _ => {
            return Err(format!(
                "{s:?}: expected bytes with an optional suffix Ki, Mi, Gi, K, M or G (256Mi), or unlimited"
            ));
        }
    };
    let n: u64 = number.parse().map_err(|_| format!("{s:?}: expected a whole number of bytes, such as 256Mi"))?;
    n.checked_mul(unit).ok_or_else(|| format!("{s:?}: too large"))
}

/// Reads the limit of the cgroup this process runs in.
pub fn container_limit() -> Option<u64> {
    let v2 = std::fs::read_to_string("/sys/fs/cgroup/memory.max").ok();
    let v1 = std::fs::read_to_string("/sys/fs/cgroup/memory/memory.limit_in_bytes").ok();
    cgroup_limit(v2.as_deref(), v1.as_deref())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MI: u64 = 1024 * 1024;

    #[test]
    fn the_manifests_limit_fits_the_documented_apps_per_replica() {
        // deploy/: limits.memory 320Mi; 80 % of it serves 3,456 Apps, above the 3,000 the
        // docs recommend per replica.
        let budget = Budget::from_bytes(default_bytes(Some(320 * MI)).unwrap_or_default());
        assert_eq!(budget.max_apps, 3_456);
        assert_eq!(Budget::from_bytes(BASELINE_BYTES).max_apps, 0);
        assert_eq!(Budget::from_bytes(0).max_apps, 0);
    }

    #[test]
    fn shards_allowed_table() {
        let b = Budget { max_apps: 100 };
        // (apps, held) -> allowed
        let table = [
            ((0, 0), 1),    // nothing known: one at a time
            ((0, 5), 1),    // no App seen yet: one at a time
            ((50, 5), 5),   // 10 per shard, room for 50
            ((95, 5), 0),   // room for 5, a shard weighs 19
            ((100, 5), 0),  // full
            ((150, 10), 0), // over (Apps created in held shards): never more
            ((10, 10), 90), // one per shard
        ];
        for ((apps, held), want) in table {
            assert_eq!(b.shards_allowed(apps, held), want, "apps {apps}, held {held}");
        }
        assert_eq!(Budget { max_apps: 0 }.shards_allowed(0, 0), 0);
        for ((apps, held), want) in table {
            assert_eq!(b.is_full(apps, held), want == 0, "full at apps {apps}, held {held}");
        }
    }

    #[test]
    fn budget_values() {
        assert_eq!(parse_bytes("256Mi"), Ok(256 * MI));
        assert_eq!(parse_bytes("1G"), Ok(1_000_000_000));
        assert_eq!(parse_bytes("4096"), Ok(4096));
        assert_eq!(parse_bytes("unlimited"), Ok(u64::MAX));
        assert!(parse_bytes("256MB").is_err());
        assert!(parse_bytes("-1Mi").is_err());
        assert!(parse_bytes("99999999999999999999Gi").is_err());
        assert!(parse_bytes("18446744073709551615Ki").is_err());
        assert_eq!(
            Budget::from_bytes(u64::MAX).max_apps,
            usize::try_from((u64::MAX - BASELINE_BYTES) / PER_APP_BYTES).unwrap_or(usize::MAX)
        );
    }

    #[test]
    fn cgroup_files() {
        assert_eq!(cgroup_limit(Some("max\n"), None), None);
        assert_eq!(cgroup_limit(Some("335544320\n"), None), Some(335_544_320));
        assert_eq!(cgroup_limit(None, Some("9223372036854771712\n")), None);
        assert_eq!(cgroup_limit(None, Some("268435456")), Some(268_435_456));
        assert_eq!(cgroup_limit(None, None), None);
        assert_eq!(default_bytes(Some(100)), Some(80));
    }

    proptest! {
        /// Taking what is allowed at the average weight never plans past the budget.
        #[test]
        fn never_plans_past_the_budget(max in 0usize..10_000, held in 1usize..64, per in 1usize..200) {
            let apps = held * per;
            let allowed = Budget { max_apps: max }.shards_allowed(apps, held);
            prop_assert!(apps >= max || apps + allowed * per <= max);
            prop_assert!(apps < max || allowed == 0);
        }
    }
}
