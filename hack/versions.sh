# Pinned versions of everything the local control plane is built from.
# Sourced by the other hack/ scripts; changing a version changes the cache key.
K8S_VERSION=v1.36.3
K8S_STAGING_VERSION=v0.36.3
ETCD_VERSION=v3.6.14
KWOK_VERSION=v0.8.0
FLOTILLA_CACHE=${FLOTILLA_CACHE:-$HOME/.cache/flotilla}
K8S_BIN=$FLOTILLA_CACHE/k8s-$K8S_VERSION
ETCD_BIN=$FLOTILLA_CACHE/etcd-$ETCD_VERSION
KWOK_BIN=$FLOTILLA_CACHE/kwok-$KWOK_VERSION
# Cargo's target dir lives outside the clone so that a fresh clone (CI) builds warm.
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$FLOTILLA_CACHE/target}
export PATH=$K8S_BIN:$ETCD_BIN:$KWOK_BIN:$HOME/.cargo/bin:/usr/local/go/bin:$PATH
JAEGER_VERSION=v1.76.0
JAEGER_BIN=$FLOTILLA_CACHE/jaeger-$JAEGER_VERSION
export PATH=$JAEGER_BIN:$PATH
HELM_VERSION=v3.22.0
HELM_BIN=$FLOTILLA_CACHE/helm-$HELM_VERSION
export PATH=$HELM_BIN:$PATH
# The real node's kubelet (hack/real-node.sh), same Kubernetes version.
KUBELET_BIN=$FLOTILLA_CACHE/kubelet-$K8S_VERSION
# Argo Rollouts, run beside Flotilla by bench/scale.sh --with-argo (never by the tests). Its
# go.mod asks for a newer Go than 1.26, so its build takes Go 1.27.3 from the module proxy.
ARGO_ROLLOUTS_VERSION=v1.10.2
ARGO_ROLLOUTS_BIN=$FLOTILLA_CACHE/argo-rollouts-$ARGO_ROLLOUTS_VERSION
ARGO_ROLLOUTS_GOTOOLCHAIN=go1.27.3
# Gateway API standard-channel CRDs (HTTPRoute), installed by hack/gateway-api.sh from the
# sigs.k8s.io/gateway-api Go module, which ships them: for routed canaries in the tests and
# the demo. No data plane: only the API objects.
GATEWAY_API_VERSION=v1.6.3
