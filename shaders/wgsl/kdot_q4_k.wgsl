// Q4_K against a Q8_K block (see dec_q4_k.wgsl for the layout): (sumi, summ) with
// sumi = sum_s sc_s * sum_l q_l * a_l and summ = sum_s m_s * (sum of the sub-block's 32 a).
const KBYTES: u32 = 144u;

fn kscales(b: u32) -> vec2<f32> { return vec2<f32>(wf16(b), wf16(b + 2u)); }

fn kdot(b: u32, ab: u32) -> vec2<i32> {
    let sc = b + 4u;
    var sumi: i32 = 0;
    var summ: i32 = 0;
    for (var s = 0u; s < 8u; s++) {
        var scale: u32;
        var mn: u32;
        if (s < 4u) {
            scale = wbyte(sc + s) & 63u;
            mn = wbyte(sc + s + 4u) & 63u;
        } else {
            scale = (wbyte(sc + s + 4u) & 0xfu) | ((wbyte(sc + s - 4u) >> 6u) << 4u);
            mn = (wbyte(sc + s + 4u) >> 4u) | ((wbyte(sc + s) >> 6u) << 4u);
        }
        let qs = b + 16u + (s >> 1u) * 32u;
        let shift = (s & 1u) * 4u;
        var dot: i32 = 0;
        for (var w = 0u; w < 8u; w++) {
            let q = wword(qs + 4u * w) >> shift;
            for (var i = 0u; i < 4u; i++) {
                dot += i32((q >> (8u * i)) & 0xfu) * aq(ab, 32u * s + 4u * w + i);
            }
        }
        let bs = bitcast<i32>(qa[ab + 65u + 2u * s]) + bitcast<i32>(qa[ab + 66u + 2u * s]);
        sumi += i32(scale) * dot;
        summ += i32(mn) * bs;
    }
    return vec2<i32>(sumi, summ);
}
