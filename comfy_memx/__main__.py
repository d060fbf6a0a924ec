from comfy_memx.cli.launcher import main

main()
