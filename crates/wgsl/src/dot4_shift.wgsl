// The 4 x int8 dot product without the language extension: shift each byte to the top of an i32,
// then an arithmetic right shift sign-extends it.
fn dot4(x: u32, y: u32) -> i32 {
    let xi = bitcast<i32>(x);
    let yi = bitcast<i32>(y);
    var sum = 0;
    for (var s = 0u; s < 32u; s += 8u) {
        let xb = (xi << (24u - s)) >> 24u;
        let yb = (yi << (24u - s)) >> 24u;
        sum += xb * yb;
    }
    return sum;
}
