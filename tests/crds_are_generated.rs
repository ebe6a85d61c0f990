//! crds/ holds exactly what `flotilla crd` prints, so the checked-in YAML never drifts from
//! the Rust types. Regenerate with: cargo run -q -- crd > crds/flotilla.dev.yaml

#[test]
fn checked_in_crds_match_the_rust_types() {
    let generated = flotilla::api::crds_yaml().expect("rendering CRDs");
    // The run's directory, not the build's: the target dir is shared between clones.
    let root = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| env!("CARGO_MANIFEST_DIR").to_string());
    let checked_in =
        std::fs::read_to_string(format!("{root}/crds/flotilla.dev.yaml")).expect("reading crds/flotilla.dev.yaml");
    assert!(
        generated == checked_in,
        "crds/flotilla.dev.yaml is out of date; regenerate it with `cargo run -q -- crd > crds/flotilla.dev.yaml`"
    );
}
