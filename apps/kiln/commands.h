// Entry points of the `kiln` subcommands; argv[0] is the subcommand's name.
#pragma once

namespace kiln::cli {

int cmd_plugins(int argc, char** argv);
int cmd_recipe(int argc, char** argv);
int cmd_generate(int argc, char** argv);
int cmd_bench(int argc, char** argv);
int cmd_ab(int argc, char** argv);
int cmd_serve(int argc, char** argv);
int cmd_quantize(int argc, char** argv);
int cmd_qualify(int argc, char** argv);

// `kiln bench decode|prefill` (cmd_bench_model.cpp), dispatched by cmd_bench; argv[0] is "decode" / "prefill".
int bench_decode(int argc, char** argv);
int bench_prefill(int argc, char** argv);

}  // namespace kiln::cli
