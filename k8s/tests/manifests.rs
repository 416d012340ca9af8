//! deploy/kubernetes agrees with the code: the node config in its ConfigMap is one the arbiter
//! (and the extender) accepts, with the SMORE policy. Schema validation of the manifests
//! themselves is deploy/kubernetes/validate.py (run by .ci/run).

use smore_arbiter::config::{Config, PolicyKind};

/// The `node.toml: |` block scalar of deploy/kubernetes/configmap.yaml.
fn node_toml() -> String {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../deploy/kubernetes/configmap.yaml"
    );
    let text = std::fs::read_to_string(path).unwrap();
    let mut lines = text.lines().skip_while(|l| l.trim() != "node.toml: |");
    assert!(lines.next().is_some(), "no node.toml block in {path}");
    let block: Vec<&str> = lines
        .take_while(|l| l.is_empty() || l.starts_with("    "))
        .collect();
    block
        .iter()
        .map(|l| l.get(4..).unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn the_configmaps_node_config_is_valid_and_uses_the_smore_policy() {
    let text = node_toml();
    let cfg = Config::parse(&text, "deploy/kubernetes/configmap.yaml").unwrap();
    assert_eq!(
        cfg.policy,
        PolicyKind::Smore,
        "the extender predicts with SMORE's policy"
    );
    assert_eq!(cfg.metrics_addr.as_deref(), Some("0.0.0.0:9464"));
}
