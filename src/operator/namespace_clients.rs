//! The connections of the namespaces a replica serves: a few namespaces per client, so per
//! HTTP/2 connection (`packing`), each client built with the replica's bounds and fences
//! (`clients`). Handed to the namespace supervisor (`tenancy::served`) as its
//! `NamespaceConnections`.

use kube::Client;
use tracing::warn;

use super::clients::Clients;
use super::packing::Packing;
use crate::tenancy::served::NamespaceConnections;

pub struct NamespaceClients {
    clients: Clients,
    /// Used when a new client cannot be built (the configuration was already good once).
    fallback: Client,
    packing: Packing<Client>,
}

impl NamespaceClients {
    /// New clients from `clients`, `per_connection` namespaces on each; `fallback` when one
    /// cannot be built.
    pub fn new(clients: Clients, fallback: Client, per_connection: usize) -> Self {
        Self { clients, fallback, packing: Packing::new(per_connection) }
    }
}

impl NamespaceConnections for NamespaceClients {
    fn for_namespace(&mut self, namespace: &str) -> Client {
        let Self { clients, fallback, packing } = self;
        packing.assign(namespace, || {
            clients.client().unwrap_or_else(|e| {
                warn!(namespace, error = %e, "no connection of its own for the namespace; sharing the replica's");
                fallback.clone()
            })
        })
    }

    fn release(&mut self, namespace: &str) {
        self.packing.release(namespace);
    }

    fn connections(&self) -> usize {
        self.packing.connections()
    }
}
