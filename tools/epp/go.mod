// Wrapper module that pins the llm-d endpoint picker (llm-d-router cmd/epp) for the
// real-picker cluster test. tools/build-epp.sh builds it into the longctx cache.
// llm-d-router's own go.mod has no replace directives, so none are mirrored here.
module longctx.dev/tools/epp

go 1.26.6

require github.com/llm-d/llm-d-router v0.10.0

tool github.com/llm-d/llm-d-router/cmd/epp
