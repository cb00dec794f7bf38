#include <cstdio>
int main() { std::puts("kiln " KILN_VERSION); return 0; }
