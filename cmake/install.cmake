# Install rules, two components:
#   runtime (the default of `cmake --install build --prefix P`): bin/memwall and bin/memwall-gui,
#           the bash completion (share/bash-completion/completions/memwall) and the built-in
#           profiles as YAML to copy and edit (share/memwall/profiles/).
#   device  (`--component device`, what bench/gpu/bundle.sh packs): the programs a GPU machine runs,
#           memwall and the device tests, under libexec/memwall/ behind bin/launch, which puts the
#           bundle's lib/ and the target's CUDA libraries on the library path; bench/gpu/run.sh and
#           the files it reads.
# Installed programs carry no RPATH of the build tree (CMake rewrites it at install).
include(GNUInstallDirs)
install(TARGETS memwall RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT runtime)
if(TARGET memwall-gui)
  install(TARGETS memwall-gui RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT runtime)
endif()
install(FILES ${CMAKE_BINARY_DIR}/memwall.bash DESTINATION ${CMAKE_INSTALL_DATADIR}/bash-completion/completions
        RENAME memwall COMPONENT runtime)
install(DIRECTORY hardware_profiles/ DESTINATION ${CMAKE_INSTALL_DATADIR}/memwall/profiles COMPONENT runtime
        FILES_MATCHING PATTERN "*.yaml")

set(MEMWALL_DEVICE_PROGRAMS memwall test_backend_ops test_engine gpt_ref_tool)
install(TARGETS ${MEMWALL_DEVICE_PROGRAMS} RUNTIME DESTINATION libexec/memwall COMPONENT device EXCLUDE_FROM_ALL)
install(PROGRAMS bench/gpu/launch bench/gpu/memwall DESTINATION bin COMPONENT device EXCLUDE_FROM_ALL)
install(PROGRAMS bench/gpu/run.sh DESTINATION bench/gpu COMPONENT device EXCLUDE_FROM_ALL)
install(FILES tests/exec/engine/torch_reference.py exec/data/run.yaml tests/exec/engine/fixtures/short.yaml
        DESTINATION share/memwall COMPONENT device EXCLUDE_FROM_ALL)
