//! Every file in examples/contracts/ parses and validates.

use std::path::PathBuf;

fn examples_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples/contracts")
}

#[test]
fn every_example_validates() {
    let mut n = 0;
    let mut entries: Vec<_> = std::fs::read_dir(examples_dir())
        .expect("examples/contracts exists")
        .flatten()
        .map(|e| e.path())
        .collect();
    entries.sort();
    for p in entries {
        if p.extension().is_some_and(|e| e == "yaml" || e == "yml") {
            match contracts::load_contract(&p) {
                Ok(c) => {
                    println!("{}: ok {}", p.display(), c.summary());
                    for w in c.warnings() {
                        println!("  {w}");
                    }
                }
                Err(e) => panic!("{} does not validate:\n{e}", p.display()),
            }
            n += 1;
        }
    }
    assert!(n >= 7, "expected at least 7 examples, found {n}");
}
