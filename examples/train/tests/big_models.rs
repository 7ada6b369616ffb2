//! The README's table of big models is the planner's: the largest preset
//! each store mode fine-tunes in full on hosts of 64 GiB to 1 TiB beside an
//! 80 GiB GPU (`trainer::run::big_models_table`).

use std::path::Path;

#[test]
fn the_readme_big_models_table_is_the_planners() {
    let table = trainer::run::big_models_table();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    assert!(
        readme.contains(&table),
        "README.md's big-models table differs from the planner's; put this one in its place:\n{table}"
    );
}

#[test]
fn the_table_grows_with_the_host_and_with_fewer_bytes_a_parameter() {
    let table = trainer::run::big_models_table();
    let params = |cell: &str| -> f64 {
        cell.split(['(', 'B'])
            .nth(1)
            .and_then(|p| p.trim().parse().ok())
            .unwrap_or(0.0)
    };
    let rows: Vec<Vec<f64>> = table
        .lines()
        .skip(2)
        .map(|row| {
            row.split('|')
                .skip(2)
                .filter(|c| !c.is_empty())
                .map(params)
                .collect()
        })
        .collect();
    assert_eq!(rows.len(), 5, "{table}");
    for (i, row) in rows.iter().enumerate() {
        assert_eq!(row.len(), trainer::run::STORE_MODES.len(), "{table}");
        assert!(row.windows(2).all(|w| w[0] <= w[1]), "row {i}: {table}");
        if i > 0 {
            let above = &rows[i - 1];
            assert!(
                row.iter().zip(above).all(|(b, a)| b >= a),
                "row {i}: {table}"
            );
        }
    }
    // The 8-bit fused mode fits a 70B-class model on the 512 GiB host.
    assert!(rows[3][4] >= 60.0, "{table}");
}
