//! The verified INT8 GEMM: one scale per activation row, one per weight column, exact i32 accumulation
//! (DESIGN.md §3). Every matrix multiply in the project goes through this crate.
