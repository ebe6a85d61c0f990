//! Which shard a namespace belongs to: FNV-1a-64 of its name, modulo the shard count.
//! Changing this function would move every tenant at once on upgrade; a golden test pins it.

use crate::api::fingerprint::fnv1a64;

/// The shard of a namespace among `shards` (which must be at least 1).
pub fn shard_of(namespace: &str, shards: u32) -> u32 {
    let n = u64::from(shards.max(1));
    u32::try_from(fnv1a64(namespace.as_bytes()) % n).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn fnv1a64_reference_vectors() {
        // Published FNV-1a 64-bit test vectors.
        assert_eq!(fnv1a64(b""), 0xcbf29ce484222325);
        assert_eq!(fnv1a64(b"a"), 0xaf63dc4c8601ec8c);
        assert_eq!(fnv1a64(b"foobar"), 0x85944171f73967e8);
    }

    #[test]
    fn golden_shards_never_move() {
        let golden = [("default", 30), ("team-a-prod", 0), ("team-a-dev", 8), ("tenant-0000", 24), ("tenant-0999", 5)];
        for (ns, shard) in golden {
            assert_eq!(shard_of(ns, 32), shard, "shard of {ns} changed: every tenant would move on upgrade");
        }
    }

    #[test]
    fn spread_over_sequential_names() {
        let mut counts = [0u32; 32];
        for i in 0..1000 {
            counts[shard_of(&format!("tenant-{i:04}"), 32) as usize] += 1;
        }
        let (min, max) = (counts.iter().min().copied().unwrap_or(0), counts.iter().max().copied().unwrap_or(0));
        assert!(min >= 20 && max <= 45, "1000 sequential names spread {min}..{max} over 32 shards");
    }

    proptest! {
        #[test]
        fn always_in_range(ns in "[a-z0-9-]{1,63}", n in 1u32..512) {
            prop_assert!(shard_of(&ns, n) < n);
        }
    }
}
