//! Which connection each served namespace's watches and requests use.
//!
//! kube-apiserver allows 100 concurrent streams per HTTP/2 connection by default
//! (`--http2-max-streams-per-connection`), and hyper queues a request past that limit until
//! a stream ends. Watches end only every few minutes, so a connection carrying 100 watches
//! would hold every other request back for minutes (measured: with 10,000 Apps a replica's
//! reconciles stalled this way). Namespaces are therefore packed onto connections a few at
//! a time: each has three watches (Apps, Deployments, Services), five once an App of it
//! autoscales and one reads a ConfigMap (HPAs, ConfigMaps' metadata), and a connection
//! carries at most `per_connection` namespaces, which leaves the rest of its streams to the
//! reconciles' requests.

use std::collections::BTreeMap;

/// Namespaces packed onto connections, at most `per_connection` on each. Pure: the
/// connection type is a parameter, so the packing is tested without a cluster.
pub struct Packing<C> {
    per_connection: usize,
    /// Connection index -> the connection and how many namespaces use it.
    connections: BTreeMap<usize, (C, usize)>,
    assigned: BTreeMap<String, usize>,
    next: usize,
}

impl<C: Clone> Packing<C> {
    pub fn new(per_connection: usize) -> Self {
        Self { per_connection: per_connection.max(1), connections: BTreeMap::new(), assigned: BTreeMap::new(), next: 0 }
    }

    /// The connection of `namespace`: the one it already uses, else the first one with room,
    /// else a new one from `open`.
    pub fn assign(&mut self, namespace: &str, open: impl FnOnce() -> C) -> C {
        if let Some(index) = self.assigned.get(namespace)
            && let Some((connection, _)) = self.connections.get(index)
        {
            return connection.clone();
        }
        let room = self.connections.iter().find(|(_, (_, used))| *used < self.per_connection).map(|(i, _)| *i);
        let index = room.unwrap_or_else(|| {
            self.next += 1;
            self.next - 1
        });
        self.assigned.insert(namespace.to_string(), index);
        let entry = self.connections.entry(index).or_insert_with(|| (open(), 0));
        entry.1 += 1;
        entry.0.clone()
    }

    /// `namespace` no longer uses its connection; a connection left without namespaces is
    /// dropped (it closes once its last stream has ended).
    pub fn release(&mut self, namespace: &str) {
        let Some(index) = self.assigned.remove(namespace) else { return };
        if let Some(entry) = self.connections.get_mut(&index) {
            entry.1 = entry.1.saturating_sub(1);
            if entry.1 == 0 {
                self.connections.remove(&index);
            }
        }
    }

    /// Connections in use.
    pub fn connections(&self) -> usize {
        self.connections.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Connections are numbers here: `open` hands out 0, 1, 2...
    fn assign(p: &mut Packing<u32>, opened: &mut u32, ns: &str) -> u32 {
        p.assign(ns, || {
            *opened += 1;
            *opened - 1
        })
    }

    #[test]
    fn fills_a_connection_before_opening_the_next() {
        let mut p = Packing::new(2);
        let mut opened = 0;
        let got: Vec<u32> = ["a", "b", "c", "d", "e"].iter().map(|ns| assign(&mut p, &mut opened, ns)).collect();
        assert_eq!(got, vec![0, 0, 1, 1, 2]);
        assert_eq!(assign(&mut p, &mut opened, "a"), 0, "a namespace keeps its connection");
        assert_eq!(p.connections(), 3);
    }

    #[test]
    fn freed_room_is_reused_and_empty_connections_close() {
        let mut p = Packing::new(2);
        let mut opened = 0;
        for ns in ["a", "b", "c"] {
            assign(&mut p, &mut opened, ns);
        }
        p.release("a");
        assert_eq!(assign(&mut p, &mut opened, "d"), 0, "the room a left is used first");
        p.release("c");
        assert_eq!(p.connections(), 1, "c's connection had no other namespace");
        assert_eq!(assign(&mut p, &mut opened, "e"), 2, "a new connection, not the closed one");
        p.release("unknown");
        assert_eq!(p.connections(), 2);
    }

    proptest! {
        /// Whatever the order of starts and stops: no connection carries more than
        /// `per_connection` namespaces, a namespace keeps its connection while it runs, and
        /// no more connections are open than the running namespaces need plus one per
        /// partly filled connection (no connection is open without a namespace).
        #[test]
        fn never_over_full_and_never_empty(per in 1usize..6, ops in prop::collection::vec((0u8..20, any::<bool>()), 0..200)) {
            let mut p = Packing::new(per);
            let mut opened = 0;
            let mut running: BTreeMap<String, u32> = BTreeMap::new();
            for (n, start) in ops {
                let ns = format!("ns-{n}");
                if start {
                    let c = assign(&mut p, &mut opened, &ns);
                    if let Some(before) = running.insert(ns.clone(), c) {
                        prop_assert_eq!(before, c, "{} moved connection", ns);
                    }
                } else {
                    p.release(&ns);
                    running.remove(&ns);
                }
                let mut load: BTreeMap<u32, usize> = BTreeMap::new();
                for c in running.values() {
                    *load.entry(*c).or_default() += 1;
                }
                prop_assert!(load.values().all(|l| *l <= per), "over full: {:?}", load);
                prop_assert_eq!(p.connections(), load.len(), "a connection open without namespaces");
            }
        }
    }
}
