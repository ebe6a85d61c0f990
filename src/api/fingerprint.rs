//! FNV-1a-64: the fingerprint of pod templates (revisions) and of namespace names (shards).
//! Changing it would give every App a new revision and move every tenant at once on upgrade;
//! golden tests pin it (`sharding::hash`).

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// FNV-1a, 64 bits.
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(FNV_OFFSET, |h, b| (h ^ u64::from(*b)).wrapping_mul(FNV_PRIME))
}

/// FNV-1a-64 of bytes fed in parts: the same as `fnv1a64` of them joined.
#[derive(Clone, Copy, Debug)]
pub struct Fnv1a64(u64);

impl Default for Fnv1a64 {
    fn default() -> Self {
        Self(FNV_OFFSET)
    }
}

impl Fnv1a64 {
    pub fn update(&mut self, bytes: &[u8]) {
        self.0 = bytes.iter().fold(self.0, |h, b| (h ^ u64::from(*b)).wrapping_mul(FNV_PRIME));
    }

    /// In 16 hex digits, as `hex_fingerprint`.
    pub fn hex(&self) -> String {
        format!("{:016x}", self.0)
    }
}

impl std::io::Write for Fnv1a64 {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.update(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// FNV-1a-64 in 16 hex digits: the fingerprints kept in annotations (pod templates, Tenant
/// objects, ConfigMap data and the config stamp).
pub fn hex_fingerprint(bytes: &[u8]) -> String {
    format!("{:016x}", fnv1a64(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fed_in_parts_is_the_same_as_whole() {
        let mut h = Fnv1a64::default();
        for part in [&b"[{\"a\""[..], b":\"1\"}", b"", b",null]"] {
            h.update(part);
        }
        assert_eq!(h.hex(), hex_fingerprint(b"[{\"a\":\"1\"},null]"));
        assert_eq!(Fnv1a64::default().hex(), hex_fingerprint(b""));
    }
}
