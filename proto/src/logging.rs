//! Log output of the node processes: `tracing`'s formatter on standard error, colored only on a
//! terminal so log files stay plain text, filtered by `RUST_LOG` or else by the process's own
//! default.

/// Installs the global subscriber; `with_target` shows each line's module path (mgmd's lines
/// come from openraft as well as from Shoal's own code).
pub fn init(default_filter: &str, with_target: bool) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_filter));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(with_target)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}
