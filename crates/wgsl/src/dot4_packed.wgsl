// The 4 x int8 dot product through WGSL's packed_4x8_integer_dot_product language extension.
fn dot4(x: u32, y: u32) -> i32 {
    return dot4I8Packed(x, y);
}
