// latentq: the study driver. All logic lives in latentq_core (latentq/cli.h).
#include "latentq/cli.h"

int main(int argc, char** argv) { return latentq::cli_main(argc, argv); }
