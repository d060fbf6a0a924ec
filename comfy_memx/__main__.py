from comfy_memx._launcher import main

main()
