// Entry points of the `kiln` subcommands; argv[0] is the subcommand's name.
#pragma once

namespace kiln::cli {

int cmd_plugins(int argc, char** argv);
int cmd_recipe(int argc, char** argv);
int cmd_generate(int argc, char** argv);
int cmd_bench(int argc, char** argv);
int cmd_ab(int argc, char** argv);
int cmd_serve(int argc, char** argv);

}  // namespace kiln::cli
