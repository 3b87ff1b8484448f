//! The exhaustive check every model runs: its bound, the check to it, and a counterexample
//! search for the negative controls.

use super::*;

/// A bound of the check: the environment variable `name` (for a longer run), else `default`.
pub(crate) fn bound(name: &str, default: u8) -> u8 {
    std::env::var(name)
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(default)
}

/// A state's representative among those that differ only by the names of interchangeable
/// clients.
pub(crate) type Representative<M> = fn(&<M as Model>::State) -> <M as Model>::State;

/// Explores every state of `model` to its bound and fails on any property broken or any
/// "sometimes" never reached.
///
/// Depth first: the checker keeps only the fingerprints of the states it has seen and the path
/// it is on, tens of MB where a breadth-first search took GB, in about half the time here.
/// With a `symmetry`, one state of each class is explored.
pub(crate) fn check_to_the_bound<M>(model: M, symmetry: Option<Representative<M>>)
where
    M: Model + Send + Sync + 'static,
    M::State: std::fmt::Debug + std::hash::Hash + Clone + PartialEq + Send + Sync + 'static,
    M::Action: std::fmt::Debug + Clone + PartialEq,
{
    let started = std::time::Instant::now();
    let mut builder = model.checker().threads(2);
    if let Some(representative) = symmetry {
        builder = builder.symmetry_fn(representative);
    }
    let checker = builder.spawn_dfs().join();
    println!(
        "{} states in {:?}",
        checker.unique_state_count(),
        started.elapsed()
    );
    checker.assert_properties();
}

/// The steps of a counterexample to `property` in `model` (a negative control), found by the
/// checker as `check_to_the_bound` runs it (so that a representative which hid states would
/// show here too), stopped at the first one; fails when there is none.
pub(crate) fn counterexample<M>(
    model: M,
    property: &'static str,
    symmetry: Option<Representative<M>>,
) -> Vec<M::Action>
where
    M: Model + Send + Sync + 'static,
    M::State: std::fmt::Debug + std::hash::Hash + Clone + PartialEq + Send + Sync + 'static,
    M::Action: std::fmt::Debug + Clone + PartialEq,
{
    let mut builder = model
        .checker()
        .finish_when(HasDiscoveries::AnyOf(BTreeSet::from([property])))
        .threads(2);
    if let Some(representative) = symmetry {
        builder = builder.symmetry_fn(representative);
    }
    let checker = builder.spawn_dfs().join();
    checker.assert_any_discovery(property).into_actions()
}
