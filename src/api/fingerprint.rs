//! FNV-1a-64: the fingerprint of pod templates (revisions) and of namespace names (shards).
//! Changing it would give every App a new revision and move every tenant at once on upgrade;
//! golden tests pin it (`sharding::hash`).

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// FNV-1a, 64 bits.
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(FNV_OFFSET, |h, b| (h ^ u64::from(*b)).wrapping_mul(FNV_PRIME))
}

/// FNV-1a-64 in 16 hex digits: the fingerprints kept in annotations (pod templates, Tenant
/// objects, ConfigMap data and the config stamp).
pub fn hex_fingerprint(bytes: &[u8]) -> String {
    format!("{:016x}", fnv1a64(bytes))
}
