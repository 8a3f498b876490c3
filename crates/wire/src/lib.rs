//! Every message that crosses between peers: postcard-encoded, framed, and validated on decode.
